"""The memory plan of a training run: bytes per trainer rank and per generation GPU, before anything starts.

The model's size comes from its Hugging Face ``config.json`` alone (:mod:`nemo_tau2.models.model_shape`).

Per trainer rank (``policy.num_workers`` ranks, on GPUs of ``cluster.gpu_memory_gb`` or the visible device's):

- parameters, gradients (fp32) and optimizer state (AdamW: two fp32 moments), divided over the ranks with FSDP2
  (``policy.dtensor_cfg.enabled``), in host memory with ``cpu_offload``;
- gathered weights (FSDP2): the root (embeddings, LM head) plus two blocks (the one computing and the one
  prefetched), every block on one rank (``dtensor_cfg.reshard_after_forward``'s default there), in the compute
  dtype, and one block's unsharded gradients; replicas under bf16 autocast keep a bf16 copy of every weight;
- the reference model (KL penalty): compute dtype, sharded like the policy (host memory with ``cpu_offload``), a
  full fp32 copy for replicas;
- AdamW's step temporaries (GPU): the foreach implementation allocates one fp32 tensor per parameter (the root
  of the second moment), which the CUDA caching allocator then keeps reserved beside the next step's activations;
- activations of one training micro-batch of ``T`` tokens (``train_micro_batch_size x
  max_total_sequence_length``, or ``sequence_packing.train_mb_tokens``): what autograd keeps per token and block
  for a Llama/Qwen block with fused attention (no ``T x T`` scores), all blocks; with full activation checkpointing
  each block's input plus the part of one block's worth being recomputed that is live at the peak; selective: each
  block's input and its matmul and attention outputs plus one block's worth (``activation_checkpointing: auto`` takes
  the least recompute that fits);
- logits: ``T x vocab`` in the compute dtype and their gradient, plus the fp32 log-softmax (and the no-grad entropy
  metric) over ``T`` positions at once or ``logprob_chunk_size`` with chunking;
- a fixed runtime overhead (CUDA context, NCCL buffers, allocator slack).

With ``policy.megatron_cfg``: a rank of the first pipeline stage, its ``ceil(blocks / PP)`` layers and the vocab
split over TP, master weights and Adam moments over DP (distributed optimizer), ``PP`` micro-batches in flight (1F1B);
the reference model in host memory (the worker swaps it in for its logprobs).

Per generation GPU (vLLM): ``gpu_memory_utilization`` of the GPU, minus the weights in ``vllm_cfg.precision`` (over
``tensor_parallel_size``) and a workspace, leaves the KV cache; the plan reports how many full
``max_model_len`` sequences it holds (at least one, or vLLM refuses to start). vLLM's CPU build
(``vllm_cfg.device: cpu``) takes no GPU: per replica its weights plus ``cpu_kvcache_space_gb`` of host memory, which
CPU trainer ranks then share with it.

The terms are first principles; how much of each is live at the allocator's peak comes from a GPU's measurements
(:mod:`nemo_tau2.models.memory_constants`). A config that cannot fit is refused at start-up, naming what would fit.
"""

import math
import os
from dataclasses import dataclass, field

from nemo_tau2.cluster import ClusterConfig
from nemo_tau2.models.activation_memory import block_activation_parts, trainer_activation_bytes
from nemo_tau2.models.memory_constants import (
    OPTIMIZER_STEP_BYTES_PER_PARAM,
    RUNTIME_OVERHEAD_BYTES,
    TOKEN_BYTES_SCALE,
)
from nemo_tau2.models.model_shape import ModelShape
from nemo_tau2.models.policy.config import PolicyConfig

GB = 1e9
VLLM_WORKSPACE_BYTES = 4 * GB
"""vLLM's activation workspace and CUDA graphs outside the KV cache, per GPU."""
GIB = 2**30


# ================================================================================================ the plan


@dataclass
class DevicePlan:
    """Bytes of one GPU (or of the host's share, for a process on CPU) by what holds them."""

    what: str
    count: int  # how many such devices
    budget_bytes: float
    budget_source: str  # where the budget figure comes from
    on_gpu: bool = True
    items: dict[str, float] = field(default_factory=dict)
    host_items: dict[str, float] = field(default_factory=dict)  # offloaded to host memory, per rank
    token_items: list[str] = field(default_factory=list)  # the items that grow with the micro-batch's tokens
    notes: list[str] = field(default_factory=list)
    shortfall: str | None = None  # a reason it cannot work even within the budget

    @property
    def total_bytes(self) -> float:
        return sum(self.items.values())

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.budget_bytes and self.shortfall is None


@dataclass
class MemoryPlan:
    model: ModelShape
    devices: list[DevicePlan]
    gpus_needed: int
    gpus_available: int | None
    problems: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not self.problems


def _optimizer_bytes_per_param(cfg: PolicyConfig) -> tuple[int, str | None]:
    name = cfg.optimizer.name.rsplit(".", 1)[-1]
    if name in ("Adam", "AdamW", "NAdam", "RAdam", "Adamax"):
        return 8, None
    if name == "SGD":
        momentum = float(cfg.optimizer.kwargs.get("momentum", 0) or 0)
        return (4 if momentum else 0), None
    return 8, f"optimizer {name}: assumed 8 bytes of state per parameter"


CHECKPOINTING_MODES = ("none", "selective", "full")  # least recompute first: what auto tries, in order


def resolve_activation_checkpointing(cfg: PolicyConfig, m: ModelShape, *, reference: bool, budget: tuple) -> str:
    """``cfg``'s checkpointing mode; ``auto``: the first of the modes whose trainer plan fits ``budget``, else full."""
    if cfg.activation_checkpointing != "auto":
        return cfg.activation_checkpointing
    for mode in CHECKPOINTING_MODES:
        trial = cfg.model_copy(
            update={"dtensor_cfg": cfg.dtensor_cfg.model_copy(update={"activation_checkpointing": mode})}
        )
        if trainer_plan(trial, m, reference=reference, budget=budget).fits:
            return mode
    return "full"


def _add_token_items(plan: DevicePlan, items: list[tuple[str, float]]) -> None:
    """The items that grow with the micro-batch's tokens (scaled by the measured correction), then the runtime
    overhead of a GPU: the last items of every trainer plan."""
    for name, value in items:
        plan.items[name] = value * TOKEN_BYTES_SCALE
        plan.token_items.append(name)
    if plan.on_gpu:
        plan.items["CUDA context, NCCL, allocator slack"] = RUNTIME_OVERHEAD_BYTES


def trainer_plan(cfg: PolicyConfig, m: ModelShape, *, reference: bool, budget: tuple[float, str]) -> DevicePlan:
    """One trainer rank's bytes (see the module docstring) against ``budget`` (bytes, where they come from)."""
    if cfg.megatron_cfg.enabled:
        return _megatron_trainer_plan(cfg, m, reference=reference, budget=budget)
    n = cfg.num_workers
    p = m.parameters
    sharded = cfg.dtensor_cfg.enabled
    offload = cfg.dtensor_cfg.cpu_offload
    c = 2 if cfg.precision == "bfloat16" else 4
    optimizer_bytes, note = _optimizer_bytes_per_param(cfg)
    share = p / n if sharded else p
    on_gpu = cfg.device == "cuda"
    what = "trainer rank GPU" if on_gpu else "trainer rank (CPU)"
    plan = DevicePlan(what=what, count=n, budget_bytes=budget[0], budget_source=budget[1], on_gpu=on_gpu)
    if note:
        plan.notes.append(note)
    states = {
        "parameters (fp32)": 4 * share,
        "gradients (fp32)": 4 * share,
        f"optimizer state ({optimizer_bytes} B/param)": optimizer_bytes * share,
    }
    (plan.host_items if offload else plan.items).update(states)
    if sharded:
        kept = 2 if cfg.dtensor_cfg.reshards(n) else m.num_blocks  # one rank keeps every block gathered
        plan.items[f"gathered weights (root + {kept} blocks) and 1 block's gradients"] = (
            m.root_parameters + kept * m.block_parameters
        ) * c + m.block_parameters * (c + 4)
    elif c == 2:
        plan.items["bf16 autocast copies of the weights"] = 2 * p
    if on_gpu and not offload and optimizer_bytes:
        plan.items["AdamW step temporaries (foreach, kept reserved)"] = OPTIMIZER_STEP_BYTES_PER_PARAM * share
    if reference:
        if sharded:
            (plan.host_items if offload else plan.items)["reference model (compute dtype)"] = c * share
        else:
            plan.items["reference model (fp32)"] = 4 * p
    tokens = (
        cfg.train_mb_tokens
        if cfg.sequence_packing.enabled
        else cfg.train_micro_batch_size * (cfg.max_total_sequence_length)
    )
    checkpointing = resolve_activation_checkpointing(cfg, m, reference=reference, budget=budget)
    activations, label = trainer_activation_bytes(m, c, tokens, checkpointing)
    chunk = min(cfg.logprob_chunk_size or tokens, tokens)
    logits = tokens * m.vocab_size * (2 * c) + chunk * m.vocab_size * 12  # logits + grad; fp32 chunk + entropy
    logits_label = f"logits (vocab {m.vocab_size}, fp32 softmax over {chunk} positions at a time)"
    _add_token_items(plan, [(label, activations), (logits_label, logits)])
    return plan


def _megatron_trainer_plan(
    cfg: PolicyConfig, m: ModelShape, *, reference: bool, budget: tuple[float, str]
) -> DevicePlan:
    """:func:`trainer_plan` for ``policy.megatron_cfg``: a rank of the first pipeline stage (the fullest)."""
    c, mc, on_gpu = (2 if cfg.precision == "bfloat16" else 4), cfg.megatron_cfg, cfg.device == "cuda"
    tp, pp = mc.tensor_model_parallel_size, mc.pipeline_model_parallel_size
    what = f"Megatron rank {'GPU' if on_gpu else '(CPU)'} (TP {tp}, PP {pp}, first stage)"
    plan = DevicePlan(what=what, count=cfg.num_workers, budget_bytes=budget[0], budget_source=budget[1], on_gpu=on_gpu)
    layers = math.ceil(m.num_blocks / pp)
    share = (m.block_parameters * layers + m.root_parameters) / tp  # each layer's matrices and the vocab over TP
    over = max(1, cfg.num_workers // (tp * pp)) if mc.optimizer.use_distributed_optimizer else 1
    plan.items[f"weights ({'bf16' if c == 2 else 'fp32'}), 1/{tp} of {layers} of {m.num_blocks} layers"] = c * share
    plan.items["gradients (fp32 main_grad)"] = 4 * share
    if c == 2:
        plan.items[f"fp32 master weights (over {over} DP rank(s))"] = 4 * share / over
    plan.items[f"optimizer state (8 B/param, over {over} DP rank(s))"] = 8 * share / over
    if reference:  # the worker keeps the initial weights on the host and swaps them in (the current ones out)
        plan.host_items["reference model (compute dtype, swapped in from host memory)"] = c * share
        plan.host_items["current weights while the reference is swapped in"] = c * share
    whole, split = block_activation_parts(m, c)  # whole on every TP rank unless sequence parallelism splits it
    per_layer = (whole + split) / tp if mc.sequence_parallel else whole + split / tp
    tokens = (
        cfg.train_mb_tokens
        if cfg.sequence_packing.enabled
        else cfg.train_micro_batch_size * cfg.max_total_sequence_length
    )
    if mc.activation_checkpointing:  # 1F1B: the first stage keeps pp micro-batches of its layers in flight
        inputs = c * m.hidden_size / (tp if mc.sequence_parallel else 1)
        activations = tokens * (pp * layers * inputs + per_layer)
        label = f"activations, {tokens} tokens x {pp} in flight (checkpointed: layer inputs + 1 layer)"
    else:
        activations = tokens * pp * layers * per_layer
        label = f"activations, {tokens} tokens x {pp} in flight ({layers} layers)"
    chunk = min(cfg.logprob_chunk_size or tokens, tokens)
    logits = (tokens * 2 * c + chunk * 12) * m.vocab_size / tp
    logits_label = f"logits (vocab {m.vocab_size} / TP {tp}, last stage; fp32 softmax over {chunk} positions)"
    _add_token_items(plan, [(label, activations), (logits_label, logits)])
    return plan


def generation_plan(cfg: PolicyConfig, m: ModelShape, gpu: tuple[float, str], host_bytes: float) -> DevicePlan | None:
    """One vLLM GPU's bytes (or one CPU replica's host bytes), or None when generation is not vLLM."""
    generation = cfg.generation
    if generation is None or generation.backend != "vllm":
        return None
    vllm = generation.backend_block
    width = 4 if vllm.precision == "float32" else 2  # auto: the checkpoint's dtype, bf16 for every model we ship
    max_len = vllm.max_model_len or m.max_position_embeddings
    if vllm.device == "cpu":  # vLLM's CPU build: no GPU, a fixed KV cache in host memory
        replicas = vllm.data_parallel_size
        plan = DevicePlan("vLLM replica (CPU)", replicas, host_bytes / replicas, "host memory", on_gpu=False)
        plan.items[f"weights ({vllm.precision})"] = width * m.parameters
        kv_cache = float(vllm.cpu_kvcache_space_gb * GIB)
        plan.items["KV cache (cpu_kvcache_space_gb)"] = kv_cache
        tp, fix = 1, "raise policy.generation.vllm_cfg.cpu_kvcache_space_gb or lower max_model_len"
    else:
        tp = vllm.tensor_parallel_size
        claimed = vllm.gpu_memory_utilization * gpu[0]
        plan = DevicePlan("vLLM GPU", tp * vllm.data_parallel_size, claimed, f"gpu_memory_utilization of {gpu[1]}")
        plan.items[f"weights ({vllm.precision})"] = width * m.parameters / tp
        plan.items["vLLM workspace"] = VLLM_WORKSPACE_BYTES
        kv_cache = max(claimed - plan.total_bytes, 0.0)
        plan.items["KV cache (the rest of gpu_memory_utilization)"] = kv_cache
        fix = "raise policy.generation.vllm_cfg.gpu_memory_utilization or tensor_parallel_size, or lower max_model_len"
    per_sequence = 2 * m.num_blocks * m.kv_width * width * max_len / tp  # K and V
    sequences = kv_cache / per_sequence if per_sequence else math.inf
    plan.notes.append(f"KV cache holds {sequences:.1f} sequences of max_model_len {max_len}")
    if sequences < 1:
        plan.shortfall = f"the KV cache holds {sequences:.2f} sequences of max_model_len {max_len}: {fix}"
    return plan


def host_memory_bytes() -> float:
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def gpu_memory_bytes(cluster: ClusterConfig) -> tuple[float, str]:
    """The visible GPU's memory, else ``cluster.gpu_memory_gb``."""
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            return float(props.total_memory), f"{props.name} (visible)"
    except ImportError:
        pass
    return cluster.gpu_memory_gb * GB, "cluster.gpu_memory_gb"


def trainer_budget(cfg: PolicyConfig, cluster: ClusterConfig, generation: DevicePlan | None) -> tuple[float, str]:
    """A trainer rank's memory: its GPU's, or on CPU its share of the host's (after vLLM's CPU replicas)."""
    if cfg.device == "cuda":
        return gpu_memory_bytes(cluster)
    host, source = host_memory_bytes(), "host memory"
    if generation is not None and not generation.on_gpu:
        host -= generation.count * generation.total_bytes
        source += " less vLLM's"
    if cfg.num_workers > 1:
        source += f", shared by {cfg.num_workers} ranks"
    return max(host, 0.0) / cfg.num_workers, source


def make_plan(cfg: PolicyConfig, cluster: ClusterConfig, *, reference: bool, shape: ModelShape) -> MemoryPlan:
    """The plan of a run whose trainer is ``cfg`` (and its ``generation``) on ``cluster``."""
    generation = generation_plan(cfg, shape, gpu_memory_bytes(cluster), host_memory_bytes())
    trainer = trainer_plan(cfg, shape, reference=reference, budget=trainer_budget(cfg, cluster, generation))
    devices = [trainer] + ([generation] if generation is not None else [])
    vllm_gpus = generation.count if generation is not None and generation.on_gpu else 0
    gpus_needed = (cfg.num_workers if trainer.on_gpu else 0) + vllm_gpus
    available = cluster.gpus_per_node * cluster.num_nodes if cluster.gpus_per_node else None
    plan = MemoryPlan(shape, devices, gpus_needed, available)
    if available is not None and gpus_needed > available:
        plan.problems.append(
            f"the run needs {gpus_needed} GPUs (policy.num_workers {cfg.num_workers if trainer.on_gpu else 0} + vLLM "
            f"{vllm_gpus}), the cluster has {available}: lower policy.num_workers"
        )
    if not trainer.fits:
        fixes = trainer_fixes(cfg, cluster, reference=reference, shape=shape)
        hint = "; ".join(fixes) if fixes else "no single setting is enough: use more or larger GPUs"
        plan.problems.append(
            f"a trainer rank needs {trainer.total_bytes / GB:.1f} GB, more than its {trainer.budget_bytes / GB:.1f} "
            f"GB; change: {hint}"
        )
    if generation is not None and not generation.fits:
        where = "a vLLM GPU" if generation.on_gpu else "a vLLM CPU replica"
        plan.problems.append(
            f"on {where} {generation.shortfall or 'the weights do not fit: raise tensor_parallel_size'}"
        )
    return plan


def trainer_fixes(cfg: PolicyConfig, cluster: ClusterConfig, *, reference: bool, shape: ModelShape) -> list[str]:
    """What makes a trainer rank fit: single settings that are enough on their own (up to three), else the
    shortest cumulative list of settings, each as ``key=value``, with the resulting bytes per rank."""
    vllm = generation_plan(cfg, shape, gpu_memory_bytes(cluster), host_memory_bytes())
    budget = trainer_budget(cfg, cluster, vllm)
    total_gpus = cluster.gpus_per_node * cluster.num_nodes if cluster.gpus_per_node else 8 * cluster.num_nodes
    free_gpus = max(total_gpus - (vllm.count if vllm is not None and vllm.on_gpu else 0), cfg.num_workers)
    candidates: list[tuple[str, dict]] = []
    if not cfg.dtensor_cfg.enabled:
        candidates.append(("policy.dtensor_cfg.enabled=true", {"dtensor_cfg": {"enabled": True}}))
    if cfg.activation_checkpointing not in ("auto", "full"):
        candidates.append(
            ("policy.dtensor_cfg.activation_checkpointing=true", {"dtensor_cfg": {"activation_checkpointing": True}})
        )
    if cfg.logprob_chunk_size is None:
        candidates.append(("policy.logprob_chunk_size=1024", {"logprob_chunk_size": 1024}))
    if not cfg.sequence_packing.enabled and cfg.train_micro_batch_size > 1:
        candidates.append(("policy.train_micro_batch_size=1", {"train_micro_batch_size": 1}))
    if free_gpus > cfg.num_workers and cfg.device == "cuda":
        candidates.append((f"policy.num_workers={free_gpus}", {"num_workers": free_gpus}))
    if cfg.device == "cuda" and not cfg.dtensor_cfg.cpu_offload:
        candidates.append(("policy.dtensor_cfg.cpu_offload=true", {"dtensor_cfg": {"cpu_offload": True}}))

    def rank_bytes(data: dict) -> float | None:
        try:
            trial = PolicyConfig.model_validate(data)
        except ValueError:
            return None
        return trainer_plan(trial, shape, reference=reference, budget=budget).total_bytes

    base = cfg.model_dump()
    singles = []
    for label, change in candidates:
        size = rank_bytes(_merged(base, change))
        if size is not None and size <= budget[0]:
            singles.append(f"{label} ({size / GB:.1f} GB)")
    if singles:
        return singles[:3]
    current, applied = base, []
    for label, change in candidates:  # in order: the cheapest settings first, CPU offload last
        trial = _merged(current, change)
        if "cpu_offload" in label:
            trial = _merged(trial, {"dtensor_cfg": {"enabled": True}})
        size = rank_bytes(trial)
        if size is None:
            continue
        current, applied = trial, [*applied, label]
        if size <= budget[0]:
            return [", ".join(applied) + f" ({size / GB:.1f} GB)"]
    return []


def _merged(base: dict, change: dict) -> dict:
    out = dict(base)
    for key, value in change.items():
        out[key] = _merged(base.get(key) or {}, value) if isinstance(value, dict) else value
    return out
