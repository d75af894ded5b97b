//! Python worker processes: the harness shipped in the binary, CPU compile pool, per-device evaluation
//! workers, timeouts, crash containment and respawn.
