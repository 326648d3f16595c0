//! The gateway in front of SeaweedFS, a second S3 implementation beside
//! Garage: the small cluster of `scripts/seaweedfs-cluster.sh` (a master,
//! two volume servers holding every object twice, a filer and its S3
//! gateway) that `scripts/seaweedfs-test.sh` starts around this test
//! binary (docs/reliability.md, "The gateway in front of SeaweedFS").
//!
//! It runs every store's tests (`tests/common/store.rs`), which expect
//! S3's behaviour: what passes against Garage because Garage does it
//! passes here only if SeaweedFS does it too.
//!
//! Without the cluster's settings in the environment the tests fail, saying
//! how to run them: they never pass by skipping.

mod common;
#[path = "common/gateway.rs"]
mod gateway;
#[path = "common/s3.rs"]
mod s3server;
#[path = "common/store.rs"]
mod store;

use store::{Lane, Store};

/// SeaweedFS's lane: its settings are `HIPOBJ_SEAWEEDFS_*`. Its large
/// object is one that a gateway with the old 64 MiB threshold would have
/// split; no more, so that the lane stays quick.
static SEAWEEDFS: Lane = Lane {
    name: "SeaweedFS",
    prefix: "SEAWEEDFS",
    script: "scripts/seaweedfs-test.sh",
    pid_files: &[
        "master/pid",
        "volume0/pid",
        "volume1/pid",
        "filer/pid",
        "s3/pid",
    ],
    big_mib: 96,
};

fn seaweedfs() -> Store {
    Store::from_env(&SEAWEEDFS)
}

store::store_tests!(seaweedfs);

/// SeaweedFS keeps an object's tags: they go through the gateway both ways.
#[test]
fn object_tags_go_through_the_gateway() {
    let tags = store::tags_through_the_gateway(&seaweedfs()).expect("tags");
    assert_eq!(tags, [("model".to_owned(), "llm".to_owned())]);
}

/// Two departures of SeaweedFS's from S3 (`docs/deploy.md`, "SeaweedFS as
/// the store"), which the gateway passes on as they come: its filer keeps
/// an object in 4 MiB chunks, so UploadPartCopy of a range across two of
/// them answers a multipart ETag for the part, and a GET with `partNumber`
/// of an object stored by one PutObject answers its first chunk as part 1
/// of 2, where S3 answers the whole object. Should SeaweedFS come to
/// answer as S3 does, this fails, and the docs lose a line.
#[test]
fn seaweedfs_s_own_departures_from_s3_come_through_the_gateway_as_they_came() {
    use aws_sdk_s3::primitives::ByteStream;
    let seaweedfs = seaweedfs();
    let world = hipobj_testing::world::World::new();
    let gateway = seaweedfs.gateway(&world, &seaweedfs.endpoint, &[]);
    let c = store::sdk(&gateway);
    let bucket = seaweedfs.bucket.as_str();
    let source = store::unique("chunked");
    let copy = store::unique("copied");
    let data = store::pattern(6 << 20, 21);
    store::runtime().block_on(async {
        c.put_object()
            .bucket(bucket)
            .key(&source)
            .body(ByteStream::from(data.clone()))
            .send()
            .await
            .unwrap();
        let part = c
            .get_object()
            .bucket(bucket)
            .key(&source)
            .part_number(1)
            .send()
            .await
            .unwrap();
        assert_eq!(
            (part.content_length(), part.parts_count()),
            (Some(4 << 20), Some(2)),
            "S3 would answer the whole object"
        );
        let upload = c
            .create_multipart_upload()
            .bucket(bucket)
            .key(&copy)
            .send()
            .await
            .unwrap();
        let id = upload.upload_id().unwrap();
        let copied = c
            .upload_part_copy()
            .bucket(bucket)
            .key(&copy)
            .upload_id(id)
            .part_number(1)
            .copy_source(format!("{bucket}/{source}"))
            .copy_source_range("bytes=0-5242879")
            .send()
            .await
            .unwrap();
        let etag = copied.copy_part_result().and_then(|p| p.e_tag());
        assert!(
            etag.is_some_and(|e| e.ends_with("-2\"")),
            "S3 would answer the part's MD5: {etag:?}"
        );
        c.abort_multipart_upload()
            .bucket(bucket)
            .key(&copy)
            .upload_id(id)
            .send()
            .await
            .unwrap();
    });
}
