//! The platform contract checks (`hipobj::testing::contract`) against the
//! fakes: one test per check, from the same list the Soft-RoCE lane runs
//! (`tests/rxe.rs`).

hipobj::contract_tests!(hipobj::testing::contract::Env::fake);
