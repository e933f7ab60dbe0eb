//! `redlock release KEY --token T`: compare-and-delete on every node, for a
//! holder that is gone. Another holder's lock is never touched.

use std::process::ExitCode;
use std::time::Duration;

use crate::{code, connect, fail};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The resource.
    key: String,
    /// The holder's token (the value at the key; `redlock status` shows only
    /// its fingerprint, on purpose).
    #[arg(long)]
    token: String,
}

pub(crate) async fn run(nodes: &[String], node_timeout: Duration, args: Args) -> ExitCode {
    let redlock = match connect(nodes, node_timeout, None) {
        Ok(r) => r,
        Err(code) => return code,
    };
    match redlock.release_token(&args.key, &args.token).await {
        Ok(released) if released.deleted == 0 => fail(
            code::FAILURE,
            format!(
                "no node held {:?} with that token; nothing deleted",
                args.key
            ),
        ),
        Ok(released) => {
            println!("released {:?} on {} node(s)", args.key, released.deleted);
            ExitCode::SUCCESS
        }
        Err(e) => fail(code::UNAVAILABLE, e),
    }
}
