//! The platform contract checks (`hipobj_testing::contract`) against the
//! fakes: one test per check, from the same lists the Soft-RoCE lane
//! (`tests/rxe.rs`) and a GPU machine (`tests/cuda.rs`) run.

hipobj_testing::contract_tests!(hipobj_testing::contract::Env::fake);

mod gpu {
    hipobj_testing::gpu_contract_tests!(hipobj_testing::contract::GpuEnv::fake);
}
