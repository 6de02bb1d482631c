//! Unit tests of the desired-state core (no kernel).
