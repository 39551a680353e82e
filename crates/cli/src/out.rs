//! Standard output for the commands' reports. `print!` panics when the reader has gone
//! (`prefix-router presets | head -3` printed a panic and a backtrace): here a closed pipe drops
//! the rest of the output quietly and the command goes on (it may still write its `--json` or
//! `--plot` file); any other write error is an error that says so.

use std::io::{ErrorKind, Write};

use anyhow::Context;

/// Writes `text` to standard output.
pub fn print(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != ErrorKind::BrokenPipe => Err(e).context("writing to standard output"),
        _ => Ok(()),
    }
}

/// Writes one line to standard error (progress, notes, errors). `eprintln!` panics when the
/// reader has gone (`prefix-router bench ... 2>&1 | head` panicked mid-run): here a closed pipe
/// drops the line and the command goes on.
pub fn note_line(text: std::fmt::Arguments<'_>) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_fmt(text).and_then(|()| err.write_all(b"\n"));
}

/// `eprintln!` without the panic on a closed pipe (see [`note_line`]).
#[macro_export]
macro_rules! note {
    ($($arg:tt)*) => {
        $crate::out::note_line(format_args!($($arg)*))
    };
}
