//! The platform contract checks (`hipobj::testing::contract`) against the
//! fakes: one test per check, from the same lists the Soft-RoCE lane
//! (`tests/rxe.rs`) and a GPU machine (`tests/cuda.rs`) run.

hipobj::contract_tests!(hipobj::testing::contract::Env::fake);

mod gpu {
    hipobj::gpu_contract_tests!(hipobj::testing::contract::GpuEnv::fake);
}
