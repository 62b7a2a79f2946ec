//! Coordinator tests: ports of reference §6.2 and §6.3 on a deterministic harness.
