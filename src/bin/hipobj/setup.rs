//! What a copy of one object or of many runs with: the plan of the
//! command's options, the library (or why transfers go without it), the
//! progress bar, and a transfer's error in the command's words.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use hipobj::client::Client;
use hipobj::s3::objects::{Cancel, Plan, Rdma, TransferError};

use crate::units::{human, rate};
use crate::{client, Common, Failure, Transfer};

/// The largest chunk: one registration covers at most 4 GiB.
pub(crate) const MAX_CHUNK: u64 = 4 << 30;
/// Transfers this long or longer get a progress bar (on a terminal).
const PROGRESS_FROM: u64 = 1 << 20;

/// The plan of `transfer`'s options.
pub(crate) fn plan(common: &Common, transfer: &Transfer, cancel: Cancel) -> Result<Plan, Failure> {
    if transfer.chunk == 0 || transfer.chunk > MAX_CHUNK {
        return Err(Failure::usage(format!(
            "--chunk is 1 byte to {}",
            human(MAX_CHUNK)
        )));
    }
    if transfer.streams == 0 {
        return Err(Failure::usage("--streams is at least 1"));
    }
    Ok(Plan {
        chunk: usize::try_from(transfer.chunk).map_err(|_| Failure::usage("--chunk"))?,
        streams: transfer.streams,
        device: common.device.is_some(),
        fallback: !common.no_fallback,
        verify: !transfer.no_verify,
        retries: transfer.retries,
        cancel,
    })
}

/// The library, or the reason transfers go without it; an error where that
/// is not allowed.
pub(crate) fn library(common: &Common) -> Result<Result<Client, String>, Failure> {
    match client(common) {
        Ok(client) => Ok(Ok(client)),
        Err(why) if common.no_fallback => Err(format!("{why} (and --no-fallback)").into()),
        Err(why) if common.device.is_some() => {
            Err(format!("--device needs the library: {why}").into())
        }
        Err(why) => Ok(Err(why)),
    }
}

pub(crate) fn rdma<'a>(library: &'a Result<Client, String>) -> Rdma<'a> {
    match library {
        Ok(client) => Rdma::On(client),
        Err(why) => Rdma::Off(why),
    }
}

/// A progress bar on standard error for `total` bytes, shown only on a
/// terminal, for long transfers, unless `--no-progress`.
pub(crate) fn progress_bar(total: u64, transfer: &Transfer, what: &str) -> ProgressBar {
    if transfer.no_progress || total < PROGRESS_FROM {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template(
        "{msg} [{bar:30}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_owned());
    bar
}

/// Leaves the bar on the screen with the summary's own rate (the running
/// rate of the bar is a recent one, not the whole transfer's).
pub(crate) fn finish_bar(bar: &ProgressBar, bytes: u64, seconds: f64) {
    if bar.is_hidden() {
        return;
    }
    if let Ok(style) = ProgressStyle::with_template(&format!(
        "{{msg}} [{{bar:30}}] {{binary_bytes}}/{{binary_total_bytes}} {}",
        rate(bytes, seconds)
    )) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.finish();
}

/// A transfer's error, in the command's words.
pub(crate) fn failure(e: TransferError, what: &str) -> Failure {
    match e {
        TransferError::Cancelled => format!("interrupted: the {what} stopped").into(),
        TransferError::Changed { .. } | TransferError::Resized { .. } => {
            format!("{e}; nothing was kept: run the command again to get the new version").into()
        }
        TransferError::Corrupt { .. } if what == "download" => {
            format!("{e}; nothing was kept").into()
        }
        e => e.to_string().into(),
    }
}
