//! The `ztserve` binary: argument parsing and exit codes only; the work is in the library.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use std::collections::BTreeMap;

use ztserve::config::Config;
use ztserve::format::Limits;
use ztserve::tools;

#[derive(Parser)]
#[command(name = "ztserve", version, about = "Serve and inspect zTensor (.zt) files")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve every .zt, .safetensors, sharded safetensors checkpoint and .gguf model under the
    /// sources over HTTP (by default: models/ on 127.0.0.1:8080).
    Serve {
        /// A directory of model files, s3://bucket/prefix, or a Hub repository
        /// hf://namespace/name[@revision] (HF_ENDPOINT, HF_TOKEN); repeat for several.
        /// Overrides `[sources] paths`.
        #[arg(long = "source", value_name = "DIR|S3_URL|HF_URL")]
        sources: Vec<String>,
        /// Address to listen on. Overrides `[server] listen`.
        #[arg(long)]
        listen: Option<String>,
        /// A TOML configuration file (see config/ztserve.toml).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// text or json. Overrides `[server] log_format`.
        #[arg(long)]
        log_format: Option<String>,
        /// Keep what is read from remote sources in this directory. Overrides `[cache] dir`.
        #[arg(long, value_name = "DIR")]
        cache_dir: Option<PathBuf>,
        /// The most bytes the disk cache holds. Overrides `[cache] max_bytes`.
        #[arg(long, value_name = "BYTES")]
        cache_max_bytes: Option<u64>,
    },
    /// Write the demo models (every format, zstd, digests, attributes) into DIR.
    WriteDemo { dir: PathBuf },
    /// Print a file's version, attributes and objects (.zt, .safetensors, a checkpoint's
    /// .safetensors.index.json with its shards, or a .gguf file with its split model's parts).
    Inspect {
        file: PathBuf,
        /// Print the whole manifest as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Check every rule, decode every component and verify every digest (.zt, .safetensors, a
    /// checkpoint's index with its shards, or a .gguf file with its split model's parts); or,
    /// given a directory, check its OpenSSF model signature (model.sig) against --public-key
    /// and --ca-file, and every file below it against what was signed. Exits 0 when the file
    /// is valid or the directory's signature verifies, 1 when not.
    Verify {
        file: PathBuf,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        limits: LimitArgs,
        /// A trusted signer's public key, PEM (a directory's signature; repeat for several).
        #[arg(long = "public-key", value_name = "PEM")]
        public_keys: Vec<PathBuf>,
        /// A PEM bundle of the CAs a signing certificate must chain to.
        #[arg(long, value_name = "PEM")]
        ca_file: Option<PathBuf>,
        /// The signature file's name in the directory.
        #[arg(long, default_value = "model.sig")]
        signature: String,
    },
    /// Write an object's decoded little-endian bytes to stdout (.zt, .safetensors, an index, or
    /// a .gguf file).
    Cat {
        file: PathBuf,
        object: String,
        /// The component role; required when the object has several.
        #[arg(long)]
        component: Option<String>,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Copy a model from a ztserve server into a local .zt file: rebuilt from its manifest and
    /// components, or with --raw the stored file itself (a directory of them for a model
    /// stored in several files, as a sharded safetensors checkpoint is). Parallel ranged GETs, retries,
    /// resume (run the same command again), digest checks; written atomically. A bearer
    /// token is read from ZTSERVE_TOKEN.
    Pull {
        /// The model's URL: http://HOST:PORT/models/MODEL_ID.
        url: String,
        /// The .zt file to write.
        output: PathBuf,
        /// Download the stored file byte for byte instead of rebuilding it.
        #[arg(long)]
        raw: bool,
        /// Only objects whose names match this glob (repeat for several; `*` matches `/`).
        #[arg(long = "objects", value_name = "GLOB", conflicts_with = "raw")]
        objects: Vec<String>,
        /// Ranged GETs in flight at once.
        #[arg(long, default_value_t = 8)]
        concurrency: usize,
        /// Bytes asked for by one GET (suffixes K, M, G: 8M).
        #[arg(long, default_value = "8M", value_parser = parse_size)]
        chunk_size: u64,
        /// Retries of a failed GET, with exponential backoff.
        #[arg(long, default_value_t = 5)]
        retries: u32,
        /// Print progress lines even on a terminal (`lines`), or nothing (`none`).
        #[arg(long, default_value = "auto", value_parser = ["auto", "lines", "none"])]
        progress: String,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Write DIR/SHA256SUMS: the SHA-256 of every file below each DIR, as `sha256sum` writes
    /// them. A server takes a model directory's SHA256SUMS for its files' digests (checked on
    /// each file's first whole read) instead of hashing them first: run it where the model is
    /// built or copied (an image build, an init container).
    Digest {
        #[arg(required = true, value_name = "DIR")]
        dirs: Vec<PathBuf>,
    },
    /// Publish a directory (an engine's compile cache) to a server's artifact store as a signed
    /// bundle, or restore one into a new directory after checking its signature. A bearer
    /// token is read from ZTSERVE_TOKEN.
    Artifacts {
        #[command(subcommand)]
        action: ArtifactAction,
    },
    /// Convert a .zt file of any generation (a v2 root with its shards), a safetensors file, a
    /// sharded checkpoint given by its .safetensors.index.json, or a .gguf file (with its split
    /// model's parts), to a zTensor 1.2 or v2 file.
    Convert {
        input: PathBuf,
        output: PathBuf,
        /// 1.2 (this crate's writer) or v2 (the official ztensor writer).
        #[arg(long, default_value = "1.2")]
        format: String,
        /// none, zstd, or (1.2) zstd:LEVEL. For v2, zstd writes zt.zstd-seekable/1 parts.
        #[arg(long, default_value = "none")]
        compress: String,
        /// 1.2: none, sha256 or crc32c. v2 parts always carry xxh3 digests.
        #[arg(long, default_value = "none")]
        digest: String,
    },
}

#[derive(Subcommand)]
enum ArtifactAction {
    /// Upload every file below DIR, then publish the bundle NAME that names them (once: a
    /// bundle already published is left as it is). Exits 0 when the bundle is there.
    Publish {
        /// The server: http://HOST:PORT.
        server: String,
        name: String,
        dir: PathBuf,
        /// The publisher's private key, PEM (ECDSA P-256, P-384 or P-521), to sign the bundle.
        #[arg(long, value_name = "PEM", env = "ZTSERVE_ARTIFACTS_SIGNING_KEY")]
        signing_key: Option<PathBuf>,
    },
    /// Restore bundle NAME into DIR (absent or empty), its signature checked against
    /// --public-key or --ca-file before a byte is fetched, each file against its SHA-256.
    /// Exits 0 when restored, 3 when nothing is published under NAME, 1 when refused.
    Restore {
        server: String,
        name: String,
        dir: PathBuf,
        /// A trusted publisher's public key, PEM (repeat for several).
        #[arg(long = "public-key", value_name = "PEM")]
        public_keys: Vec<PathBuf>,
        /// A PEM bundle of the CAs a signing certificate must chain to.
        #[arg(long, value_name = "PEM")]
        ca_file: Option<PathBuf>,
        /// Take the bundle without checking a signature (it is code the engine will run).
        #[arg(long, conflicts_with_all = ["public_keys", "ca_file"])]
        unsigned: bool,
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
        Limits {
            max_manifest_bytes: self.max_manifest_bytes,
            max_decoded_bytes: self.max_decoded_bytes,
            ..Limits::default()
        }
    }
}

/// Standard output without `std::io::Stdout`'s line buffering, which scans every binary write
/// for newlines and splits it there (a measurable cost when `cat` streams gigabytes).
fn raw_stdout() -> io::Result<io::BufWriter<File>> {
    let fd = io::stdout().as_fd().try_clone_to_owned()?;
    // Pieces at least this large bypass the buffer and go straight to the descriptor.
    Ok(io::BufWriter::with_capacity(64 << 10, File::from(fd)))
}

/// What `serve` was asked on its command line.
struct ServeFlags {
    sources: Vec<String>,
    listen: Option<String>,
    config: Option<PathBuf>,
    log_format: Option<String>,
    cache_dir: Option<PathBuf>,
    cache_max_bytes: Option<u64>,
}

fn serve(asked: ServeFlags) -> anyhow::Result<ExitCode> {
    let ServeFlags { sources, listen, config, log_format, cache_dir, cache_max_bytes } = asked;
    let mut flags = BTreeMap::new();
    if !sources.is_empty() {
        let paths = toml::Value::Array(sources.into_iter().map(toml::Value::String).collect());
        flags.insert("sources.paths".to_owned(), paths);
    }
    if let Some(listen) = listen {
        flags.insert("server.listen".to_owned(), toml::Value::String(listen));
    }
    if let Some(format) = log_format {
        flags.insert("server.log_format".to_owned(), toml::Value::String(format));
    }
    if let Some(dir) = cache_dir {
        flags.insert("cache.dir".to_owned(), toml::Value::String(dir.display().to_string()));
    }
    if let Some(bytes) = cache_max_bytes {
        let bytes = i64::try_from(bytes).map_err(|_| anyhow::anyhow!("--cache-max-bytes {bytes} is too large"))?;
        flags.insert("cache.max_bytes".to_owned(), toml::Value::Integer(bytes));
    }
    let loaded = Config::load(config.as_deref(), std::env::vars(), flags)?;
    ztserve::telemetry::init(loaded.config.server.log_format);
    for notice in &loaded.notices {
        tracing::warn!("{notice}");
    }
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        // First: a SIGTERM before the handler is installed would kill the process undrained.
        let signals = ztserve::server::shutdown_signals()?;
        let server = ztserve::server::Server::new(loaded.config)?;
        let listeners = ztserve::server::Listeners::bind(server.config()).await?;
        ztserve::server::serve(server, listeners, signals).await
    })?;
    // The drain is over: a blocking task still running (a hash, a block being written) does
    // not hold the exit past it.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    Ok(ExitCode::SUCCESS)
}

/// `8M`, `512K`, `1G` or plain bytes.
fn parse_size(text: &str) -> Result<u64, String> {
    let (digits, unit) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((at, _)) => text.split_at(at),
        None => (text, ""),
    };
    let scale: u64 = match unit.to_ascii_uppercase().trim_end_matches("IB").trim_end_matches('B') {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return Err(format!("{text:?} is not a size (examples: 8M, 512K, 1G, 65536)")),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("{text:?} is not a size above 0"))
}

fn pull(options: &ztserve::pull::PullOptions) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Runtime::new()?;
    let started = std::time::Instant::now();
    let outcome = runtime.block_on(async {
        tokio::select! {
            outcome = ztserve::pull::pull(options) => outcome.map(Some),
            _ = tokio::signal::ctrl_c() => Ok(None),
        }
    });
    let Some(report) = outcome? else {
        eprintln!("pull: interrupted; run the same command again to resume");
        return Ok(ExitCode::from(130));
    };
    let seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "pulled {} objects ({} components, {} digests verified{}) into {}: {} bytes, {} fetched{} in {seconds:.2} s",
        report.objects,
        report.components,
        report.digests_verified,
        match report.unverified {
            0 => String::new(),
            n => format!(", {n} without a digest checked for length only"),
        },
        options.output.display(),
        report.output_len,
        report.fetched,
        match report.resumed {
            0 => String::new(),
            n => format!(", {n} kept from an earlier run"),
        },
    );
    Ok(ExitCode::SUCCESS)
}

fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve { sources, listen, config, log_format, cache_dir, cache_max_bytes } => {
            serve(ServeFlags { sources, listen, config, log_format, cache_dir, cache_max_bytes })
        }
        Command::WriteDemo { dir } => {
            let written = tools::write_demo(&dir)?;
            for path in written {
                eprintln!("wrote {}", path.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Pull { url, output, raw, objects, concurrency, chunk_size, retries, progress, limits } => {
            let progress = match progress.as_str() {
                "lines" => ztserve::pull::ProgressMode::Lines,
                "none" => ztserve::pull::ProgressMode::Quiet,
                _ => ztserve::pull::ProgressMode::Auto,
            };
            let options = ztserve::pull::PullOptions {
                url,
                output,
                raw,
                concurrency,
                chunk_bytes: chunk_size,
                retry: ztserve::pull::remote::RetryPolicy { retries, ..Default::default() },
                objects,
                // Only from the environment: a token on the command line is visible to `ps`.
                token: std::env::var("ZTSERVE_TOKEN").ok().filter(|t| !t.is_empty()),
                progress,
                limits: limits.limits(),
            };
            pull(&options)
        }
        Command::Artifacts { action } => artifacts(action),
        command => run_file_command(command),
    }
}

fn artifacts(action: ArtifactAction) -> anyhow::Result<ExitCode> {
    use ztserve::tools::artifacts::{self, Published, Publishers, Restored, Store};
    let runtime = tokio::runtime::Runtime::new()?;
    let token = std::env::var("ZTSERVE_TOKEN").ok().filter(|t| !t.is_empty());
    match action {
        ArtifactAction::Publish { server, name, dir, signing_key } => {
            let store = Store { server, token };
            match runtime.block_on(artifacts::publish(&store, &name, &dir, signing_key.as_deref()))? {
                Published::Created { files, bytes, uploaded } => eprintln!(
                    "published {name}: {files} files, {bytes} bytes ({uploaded} uploaded, the rest held){}",
                    if signing_key.is_some() { ", signed" } else { ", unsigned" }
                ),
                Published::AlreadyThere => eprintln!("{name} is published already: left as it is"),
            }
            Ok(ExitCode::SUCCESS)
        }
        ArtifactAction::Restore { server, name, dir, public_keys, ca_file, unsigned } => {
            if !unsigned && public_keys.is_empty() && ca_file.is_none() {
                anyhow::bail!("name the publishers trusted (--public-key, --ca-file), or take it --unsigned");
            }
            let publishers = (!unsigned).then_some(Publishers { public_keys, ca_file });
            let store = Store { server, token };
            match runtime.block_on(artifacts::restore(&store, &name, &dir, publishers.as_ref()))? {
                Restored::Whole { files, bytes, signer } => {
                    let signer = signer.map_or_else(|| "unsigned".to_owned(), |s| format!("signed by {s}"));
                    eprintln!("restored {name} into {}: {files} files, {bytes} bytes, {signer}", dir.display());
                    Ok(ExitCode::SUCCESS)
                }
                Restored::NotPublished => {
                    eprintln!("nothing is published as {name}");
                    Ok(ExitCode::from(3))
                }
            }
        }
    }
}

fn run_file_command(command: Command) -> anyhow::Result<ExitCode> {
    let mut out = raw_stdout()?;
    let code = run_with(command, &mut out)?;
    out.flush()?;
    Ok(code)
}

fn run_with(command: Command, out: &mut io::BufWriter<File>) -> anyhow::Result<ExitCode> {
    let mut out: &mut (dyn Write + Send) = out;
    match command {
        Command::Inspect { file, json, limits } => tools::inspect(&file, json, &limits.limits(), &mut out)?,
        Command::Verify { file, json, limits, public_keys, ca_file, signature } => {
            let valid = if file.is_dir() {
                let max_signature_bytes = ztserve::config::Signing::default().max_signature_bytes;
                let check =
                    tools::SignatureCheck { public_keys, ca_file, signature_file: signature, max_signature_bytes };
                tools::verify_signature(&file, &check, json, &mut out)?
            } else {
                tools::verify(&file, json, &limits.limits(), &mut out)?
            };
            return Ok(if valid { ExitCode::SUCCESS } else { ExitCode::from(1) });
        }
        Command::Cat { file, object, component, limits } => {
            tools::cat(&file, &object, component.as_deref(), &limits.limits(), &mut out)?
        }
        Command::Serve { .. } | Command::WriteDemo { .. } | Command::Pull { .. } | Command::Artifacts { .. } => {
            unreachable!("handled by run")
        }
        Command::Digest { dirs } => {
            for dir in dirs {
                tools::digest::write_sums(&dir, &mut io::stderr())?;
            }
        }
        Command::Convert { input, output, format, compress, digest } => {
            let target = tools::Target::parse(&format, &compress, &digest)?;
            let count = tools::convert(&input, &output, &target)?;
            writeln!(io::stderr(), "wrote {count} tensors to {}", output.display())?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(code) => code,
        Err(e) if e.downcast_ref::<io::Error>().is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe) => {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
