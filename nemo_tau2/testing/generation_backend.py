"""``backend: fake``: the scripted fake model server as a generation backend (tests and CPU smoke runs).

Registered under the ``nemo_tau2.generation_backends`` entry-point group in pyproject.toml, so that
:func:`nemo_tau2.generation.launch.start_generation` starts it without library code importing this package.
"""

from pathlib import Path

from nemo_tau2.generation.config import GenerationConfig
from nemo_tau2.generation.launch import GenerationHandle
from nemo_tau2.testing.config import FakeServerConfig
from nemo_tau2.testing.fake_server import start_fake_server


def start_fake_generation(cfg: GenerationConfig, log_dir: Path | None = None) -> GenerationHandle:
    """The fake server in its own process, configured by ``fake_cfg`` (:class:`FakeServerConfig` fields); its log is
    ``<log_dir>/fake_replica0.log`` (named as a vLLM replica's), else it goes to our stderr."""
    log_file = None
    if log_dir is not None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        log_file = Path(log_dir) / "fake_replica0.log"
    fake = start_fake_server(FakeServerConfig.model_validate(cfg.fake_cfg or {}), mode="subprocess", log_file=log_file)
    return GenerationHandle(
        backend="fake", base_urls=[fake.base_url], model_name=cfg.model_name or "fake", stop=fake.close, engine=fake
    )
