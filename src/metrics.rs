//! fast_p@N, geomean speedup and correct rate per turn (or per sample count), as pure functions of the
//! folded log.
