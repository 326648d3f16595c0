//! The Soft-RoCE benchmark (being written).
fn main() {}
