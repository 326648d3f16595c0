# Sourced by the scripts that build the tests (scripts/test.sh, the lanes,
# loom): the one feature set every debug build of the tests uses, the
# suite's, the lanes' and clippy's alike, so that the library and its
# dependencies are compiled once per run instead of once per feature set.
# (vm-lane, garage-lane, seaweedfs-lane and cuda-device only add test
# targets: they change nothing the library ships.)
test_features=s3-server,cli,vm-lane,garage-lane,seaweedfs-lane,cuda-device
# The same, for a command that selects the workspace's other member too
# (the model streamer's backend, streamers3/, with its fake-world feature,
# which adds the fakes of testing/ and the fake library's controls, whose
# hipobj has the capi and server features the library's test targets have
# already): PACKAGE/FEATURE names, so that the library is built once with
# one feature set for all.
workspace_features="hipobj-streamers3/fake-world,hipobj/default,hipobj/${test_features//,/,hipobj/}"

# The test targets that need what this host may not have (the Soft-RoCE
# VM, a store's cluster, a GPU): built with the others, run in their own
# lanes (scripts/vm/lane.sh, garage-test.sh, seaweedfs-test.sh,
# scripts/gpu/test.sh), never by the host's suite.
lane_tests=(rxe e2e gateway_garage gateway_seaweedfs cuda)

# The host's test targets: every [[test]] of the library's package and of
# the fake library's (testing/fake-library/) but the lanes' (from cargo
# metadata, so that a new test file is run without being listed), as
# `--test NAME` arguments.
host_test_args() {
    cargo metadata --locked --no-deps --format-version 1 |
        python3 -c 'import json, sys
lanes = set(sys.argv[1:])
meta = json.load(sys.stdin)
for package in meta["packages"]:
    if package["name"] not in ("hipobj", "hipobj-fake"):
        continue
    for target in package["targets"]:
        if "test" in target["kind"] and target["name"] not in lanes:
            print("--test=" + target["name"])' "${lane_tests[@]}"
}

# The S3 server and the command (target/debug/hipobj-s3-server,
# target/debug/hipobj) as the suite's test build makes them: through a test
# target, whose build includes the dev-dependencies' features. A `cargo
# build` of the binary alone unifies the features without them, and
# compiled the AWS SDK's crates and everything above them again (about 4
# minutes of a fresh run).
build_test_server() {
    cargo test --locked --features "$test_features" --test s3_server --no-run
}
