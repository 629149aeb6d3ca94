//! The `ztserve` binary: argument parsing and exit codes only; the work is in the library.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use ztserve::cli;
use ztserve::format::write::WriteOptions;
use ztserve::format::Limits;

#[derive(Parser)]
#[command(name = "ztserve", version, about = "Serve and inspect zTensor (.zt) files")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print a file's version, attributes and objects.
    Inspect {
        file: PathBuf,
        /// Print the whole manifest as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Check every rule, decode every component and verify every digest.
    /// Exits 0 when the file is valid, 1 when it is not.
    Verify {
        file: PathBuf,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Write an object's decoded little-endian bytes to stdout.
    Cat {
        file: PathBuf,
        object: String,
        /// The component role; required when the object has several.
        #[arg(long)]
        component: Option<String>,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Convert a safetensors file to a zTensor 1.2 file.
    Convert {
        input: PathBuf,
        output: PathBuf,
        /// none, zstd, or zstd:LEVEL.
        #[arg(long, default_value = "none")]
        compress: String,
        /// none, sha256 or crc32c.
        #[arg(long, default_value = "none")]
        digest: String,
    },
}

#[derive(Args)]
struct LimitArgs {
    /// Largest manifest accepted, in bytes.
    #[arg(long, default_value_t = Limits::default().max_manifest_bytes)]
    max_manifest_bytes: u64,
    /// Largest decoded size of one component, in bytes.
    #[arg(long, default_value_t = Limits::default().max_decoded_bytes)]
    max_decoded_bytes: u64,
}

impl LimitArgs {
    fn limits(&self) -> Limits {
        Limits { max_manifest_bytes: self.max_manifest_bytes, max_decoded_bytes: self.max_decoded_bytes, ..Limits::default() }
    }
}

/// Standard output without `std::io::Stdout`'s line buffering, which scans every binary write
/// for newlines and splits it there (a measurable cost when `cat` streams gigabytes).
fn raw_stdout() -> io::Result<io::BufWriter<File>> {
    let fd = io::stdout().as_fd().try_clone_to_owned()?;
    // Pieces at least this large bypass the buffer and go straight to the descriptor.
    Ok(io::BufWriter::with_capacity(64 << 10, File::from(fd)))
}

fn run(command: Command) -> anyhow::Result<ExitCode> {
    let mut out = raw_stdout()?;
    let code = run_with(command, &mut out)?;
    out.flush()?;
    Ok(code)
}

fn run_with(command: Command, out: &mut io::BufWriter<File>) -> anyhow::Result<ExitCode> {
    let mut out: &mut (dyn Write + Send) = out;
    match command {
        Command::Inspect { file, json, limits } => cli::inspect(&file, json, &limits.limits(), &mut out)?,
        Command::Verify { file, json, limits } => {
            let valid = cli::verify(&file, json, &limits.limits(), &mut out)?;
            return Ok(if valid { ExitCode::SUCCESS } else { ExitCode::from(1) });
        }
        Command::Cat { file, object, component, limits } => {
            cli::cat(&file, &object, component.as_deref(), &limits.limits(), &mut out)?
        }
        Command::Convert { input, output, compress, digest } => {
            let options = WriteOptions { zstd_level: cli::parse_compress(&compress)?, digest: cli::parse_digest(&digest)? };
            let count = cli::convert(&input, &output, &options)?;
            writeln!(io::stderr(), "wrote {count} tensors to {}", output.display())?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(code) => code,
        Err(e) if e.downcast_ref::<io::Error>().is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
