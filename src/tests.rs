//! `#[pg_test]`: SQL behaviour of SPEC §1–§5 inside one server.
