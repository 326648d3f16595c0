//! `hipobj-s3-server`: the RDMA gateway ([`hipobj::gateway`]) as a
//! command: an S3 server over a directory of this machine that also serves
//! hipobj clients by RDMA.

use std::process::ExitCode;

use hipobj::gateway::{self, cli};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match cli::command(&args, &|name| std::env::var(name).ok()) {
        Ok(cli::Command::Run { options, warnings }) => {
            for warning in warnings {
                eprintln!("hipobj-s3-server: warning: {warning}");
            }
            options
        }
        Ok(cli::Command::Help) => {
            print!("{}", cli::usage());
            return ExitCode::SUCCESS;
        }
        Ok(cli::Command::Version) => {
            println!("{}", cli::version());
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("hipobj-s3-server: {e}\n{}", cli::SHORT_USAGE);
            return ExitCode::from(2);
        }
    };
    match gateway::run(*options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hipobj-s3-server: {e}");
            ExitCode::FAILURE
        }
    }
}
