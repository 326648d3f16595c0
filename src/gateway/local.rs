//! The local backend: buckets as directories of one root on this machine
//! (`--root`), through s3s's filesystem backend (s3s-fs).

use std::path::{Component, Path, PathBuf};

use s3s::{S3Request, S3Result};
use s3s_fs::FileSystem;

use super::backend::{delegate_s3, Backend};

/// Buckets as directories of `root`.
pub struct Local {
    fs: FileSystem,
    /// The root, canonical, as s3s-fs resolves paths under it.
    root: PathBuf,
}

impl Local {
    /// The backend over `root`, which must exist.
    pub fn open(root: &Path) -> Result<Local, String> {
        let fs = FileSystem::new(root).map_err(|e| format!("opening {}: {e:?}", root.display()))?;
        let root = root
            .canonicalize()
            .map_err(|e| format!("opening {}: {e}", root.display()))?;
        Ok(Local { fs, root })
    }

    /// Runs before every operation.
    async fn before<T>(&self, _req: &S3Request<T>) -> S3Result<()> {
        Ok(())
    }
}

impl Backend for Local {
    fn describe(&self) -> String {
        format!("directory {}", self.root.display())
    }

    /// The file s3s-fs keeps `bucket/key` in, for a key of plain path
    /// components only (s3s-fs resolves `..` and the like virtually under
    /// its root: such keys take the backend's own stream instead).
    fn object_file(&self, bucket: &str, key: &str) -> Option<PathBuf> {
        let plain = |p: &str| {
            !p.is_empty()
                && Path::new(p)
                    .components()
                    .all(|c| matches!(c, Component::Normal(_)))
        };
        (plain(bucket) && plain(key)).then(|| self.root.join(bucket).join(key))
    }
}

delegate_s3!(Local, fs, [
    get_object: GetObjectInput => GetObjectOutput;
    put_object: PutObjectInput => PutObjectOutput;
    upload_part: UploadPartInput => UploadPartOutput;
    create_bucket: CreateBucketInput => CreateBucketOutput;
    copy_object: CopyObjectInput => CopyObjectOutput;
    delete_bucket: DeleteBucketInput => DeleteBucketOutput;
    delete_object: DeleteObjectInput => DeleteObjectOutput;
    delete_objects: DeleteObjectsInput => DeleteObjectsOutput;
    get_bucket_location: GetBucketLocationInput => GetBucketLocationOutput;
    head_bucket: HeadBucketInput => HeadBucketOutput;
    head_object: HeadObjectInput => HeadObjectOutput;
    list_buckets: ListBucketsInput => ListBucketsOutput;
    list_objects: ListObjectsInput => ListObjectsOutput;
    list_objects_v2: ListObjectsV2Input => ListObjectsV2Output;
    create_multipart_upload: CreateMultipartUploadInput => CreateMultipartUploadOutput;
    upload_part_copy: UploadPartCopyInput => UploadPartCopyOutput;
    list_parts: ListPartsInput => ListPartsOutput;
    list_multipart_uploads: ListMultipartUploadsInput => ListMultipartUploadsOutput;
    complete_multipart_upload: CompleteMultipartUploadInput => CompleteMultipartUploadOutput;
    abort_multipart_upload: AbortMultipartUploadInput => AbortMultipartUploadOutput;
]);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_keys_are_read_from_their_file() {
        let dir = std::env::temp_dir().join(format!("hipobj-local-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let local = Local::open(&dir).unwrap();
        let root = dir.canonicalize().unwrap();
        assert_eq!(
            local.object_file("b", "dir/key.bin"),
            Some(root.join("b/dir/key.bin"))
        );
        for key in ["../escape", "a/../b", "./k", "/abs", ""] {
            assert_eq!(local.object_file("b", key), None, "{key}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
