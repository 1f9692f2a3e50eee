"""A resources server whose class takes ``IMPORT_DELAY_S`` to import: a Gym stack whose start outlasts a short lease
on any box, however fast (``gym/test_ray_placement.py``). A lease short enough that the real import alone outlasts
it (1.5 s) also ran out on a loaded CI box between two renewals; this one leaves the renewals seconds to spare.

Start it by class path, like the real one: ``nemo_tau2.testing.slow_import:SlowImportTau2ResourcesServer``.
"""

import time

from nemo_tau2.gym.resources_server.app import Tau2ResourcesServer

IMPORT_DELAY_S = 5.0

time.sleep(IMPORT_DELAY_S)  # in the fork server's import of the server classes, as a slow disk or a loaded box would


class SlowImportTau2ResourcesServer(Tau2ResourcesServer):
    """The real server; only its import is slow."""
