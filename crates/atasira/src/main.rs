//! `atasira`: the one binary. Today: the offline verbs that need no server (R-CLI-1):
//! `manifest validate|context|feasibility` and `drafts preview`.

mod offline;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// atasira governs how AI employees ("Boxes") come into being and what they may do.
#[derive(Debug, Parser)]
#[command(name = "atasira", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Work with BoxManifest YAML files offline (no server needed).
    #[command(subcommand)]
    Manifest(ManifestCommand),
    /// Work with Box drafts.
    #[command(subcommand)]
    Drafts(DraftsCommand),
}

#[derive(Debug, Subcommand)]
enum ManifestCommand {
    /// Validate a manifest. Exit 0 and {"manifest", "warnings"} when valid; exit 1 and
    /// {"errors", "warnings"} when invalid; exit 2 when the file is unreadable, over 1 MiB
    /// or not YAML.
    Validate {
        /// The manifest YAML file (`-` reads standard input).
        file: PathBuf,
    },
    /// Print the agent context XML of a manifest (R-MAN-6).
    Context {
        /// The manifest YAML file (`-` reads standard input).
        file: PathBuf,
    },
    /// Check whether a task fits a Box's declared capabilities (R-FEAS-1), as JSON.
    Feasibility {
        /// The manifest YAML file (`-` reads standard input).
        file: PathBuf,
        /// The task in plain words (English or Japanese).
        task_description: String,
    },
}

#[derive(Debug, Subcommand)]
enum DraftsCommand {
    /// Print what `POST /api/v1/boxes/box-drafts` would answer for a request body, as
    /// {"status": 201|403|422, "body": {...}}, without submitting anything.
    Preview {
        /// The BoxDraftCreateRequest JSON, inline or `-` to read standard input.
        #[arg(long = "json", value_name = "BODY")]
        json: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Manifest(ManifestCommand::Validate { file }) => offline::validate(&file),
        Command::Manifest(ManifestCommand::Context { file }) => offline::context(&file),
        Command::Manifest(ManifestCommand::Feasibility { file, task_description }) => offline::feasibility(&file, &task_description),
        Command::Drafts(DraftsCommand::Preview { json }) => offline::preview(&json),
    };
    match outcome {
        Ok(code) => code,
        Err(message) => {
            eprintln!("atasira: {message}");
            ExitCode::from(2)
        }
    }
}
