//! One Worker's run (R-HOST-1): bundle, binding, the runner as a child process, its log
//! and result, its end. The supervisor reports each step on the Worker's stream.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use atasira_contracts::{subjects, v1};
use atasira_domain::manifest::BoxManifest;
use atasira_domain::worker::{LOG_LINES, RESULT_CHARS, WorkerState};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::sync::mpsc;

use crate::decisions::Grant;
use crate::{Control, Held, Host};

/// Claims a slot for the Worker and supervises it on its own task.
pub(crate) fn start(host: Arc<Host>, w: v1::HostWorker) {
    let (control, control_rx) = mpsc::unbounded_channel();
    let (input, input_rx) = mpsc::unbounded_channel();
    let token = hex::encode(atasira_platform::auth::random_secret());
    host.lock().insert(w.worker_id.clone(), Held { inputs_seen: 0, ordered: None, control, input, token, grant: None });
    tokio::spawn(async move {
        let worker_id = w.worker_id.clone();
        if let Err(why) = supervise(&host, w, control_rx, input_rx).await {
            tracing::warn!(worker_id, "the Worker could not start: {why}");
            let end = v1::WorkerEnd { state: WorkerState::Failed.as_str().to_owned(), exit_code: None, result: format!("the Worker could not start: {why}") };
            let _ = host.report(&worker_id, v1::report_worker::Report::Finished(end)).await;
        }
        host.lock().remove(&worker_id);
    });
}

/// The bundle's manifest, when its bytes give the digest and name the Worker's Box.
pub(crate) fn verify_bundle(digest: &str, box_id: &str, canonical: &[u8]) -> Result<BoxManifest, String> {
    let actual = atasira_domain::worker::digest_of(canonical);
    if actual != digest {
        return Err(format!("the bundle's bytes give {actual}, not the digest the Worker pins"));
    }
    let value: serde_json::Value = serde_json::from_slice(canonical).map_err(|e| format!("the bundle is not JSON: {e}"))?;
    if value.get("format").and_then(serde_json::Value::as_str) != Some(atasira_domain::worker::BUNDLE_FORMAT) {
        return Err("the bundle is of an unknown format".to_owned());
    }
    if value.get("box_id").and_then(serde_json::Value::as_str) != Some(box_id) {
        return Err("the bundle belongs to another Box".to_owned());
    }
    let manifest = value.get("manifest").cloned().ok_or("the bundle holds no manifest")?;
    serde_json::from_value(manifest).map_err(|e| format!("the bundle's manifest does not read: {e}"))
}

/// Runs the Worker to its end; an error is a failure before its runner started.
async fn supervise(
    host: &Arc<Host>,
    w: v1::HostWorker,
    mut control: mpsc::UnboundedReceiver<Control>,
    mut input: mpsc::UnboundedReceiver<String>,
) -> Result<(), String> {
    let bundle = host
        .ask(subjects::RUNTIME_REGISTRY, &v1::GetBundle { digest: w.bundle_digest.clone(), worker_id: w.worker_id.clone() })
        .await
        .map_err(|e| format!("no bundle: {e:#}"))?;
    let manifest = verify_bundle(&w.bundle_digest, &w.box_id, &bundle.canonical)?;
    let resolve = v1::ResolveBinding { handle: w.binding_handle.clone(), worker_id: w.worker_id.clone() };
    let binding = host.ask(subjects::PROVISIONER, &resolve).await.map_err(|e| format!("no execution binding: {e:#}"))?;
    let workspace = std::path::PathBuf::from(&binding.workspace);
    // A symbolic link in its place would send the Worker somewhere else.
    if !tokio::fs::symlink_metadata(&workspace).await.is_ok_and(|m| m.is_dir()) {
        return Err("its workspace is not a directory of its own".to_owned());
    }
    // Paths are judged where they really lead: the workspace too.
    let workspace = tokio::fs::canonicalize(&workspace).await.map_err(|e| format!("its workspace cannot be resolved: {e}"))?;
    let context = manifest.to_agent_context_xml();
    let grant = Arc::new(Grant { manifest, workspace: workspace.to_string_lossy().into_owned(), tool_scope: binding.tool_scope });
    let token = {
        let mut held = host.lock();
        let h = held.get_mut(&w.worker_id).ok_or("the host let it go")?;
        h.grant = Some(grant);
        h.token.clone()
    };
    let decide_url = host.decide_url.get().cloned().unwrap_or_default();
    let mut command = tokio::process::Command::new("/bin/sh");
    command
        .arg("-c")
        .arg(&host.config.runner)
        .current_dir(&workspace)
        .env_clear()
        .env("PATH", &host.config.runner_path)
        .env("HOME", &workspace)
        .env("LANG", "C.UTF-8")
        .env("ATASIRA_WORKER_ID", &w.worker_id)
        .env("ATASIRA_BOX_TYPE", &w.box_type)
        .env("ATASIRA_DECIDE_URL", decide_url)
        .env("ATASIRA_WORKER_TOKEN", token)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = command.spawn().map_err(|e| format!("the runner did not start: {e}"))?;
    let group = child.id().and_then(|id| i32::try_from(id).ok()).and_then(rustix::process::Pid::from_raw);
    let signal = |sig: rustix::process::Signal| {
        if let Some(group) = group {
            let _ = rustix::process::kill_process_group(group, sig);
        }
    };
    tracing::info!(worker_id = w.worker_id, box_type = w.box_type, "Worker running");
    let _ = host.report(&w.worker_id, v1::report_worker::Report::Running(true)).await;

    // Its stdin: the context, the initial input, then later input until it ends.
    let mut stdin = child.stdin.take();
    let first = format!("{context}\n{}", atasira_domain::context::input_xml(&w.initial_input.iter().filter_map(crate::segment_from_wire).collect::<Vec<_>>()));
    let writer = tokio::spawn(async move {
        let Some(stdin) = stdin.as_mut() else { return };
        if stdin.write_all(first.as_bytes()).await.is_err() {
            return;
        }
        while let Some(more) = input.recv().await {
            if stdin.write_all(more.as_bytes()).await.is_err() {
                return;
            }
        }
    });
    let logger = child.stderr.take().map(|stderr| tokio::spawn(log_lines(host.clone(), w.worker_id.clone(), stderr)));
    let result = child.stdout.take().map(|stdout| tokio::spawn(read_result(stdout)));

    let mut ended_by_us = false;
    let mut dropped = false;
    let mut kill_at: Option<tokio::time::Instant> = None;
    let status = loop {
        let grace_over = async {
            match kill_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            status = child.wait() => break status,
            order = control.recv() => match order {
                Some(Control::Stop) => {
                    ended_by_us = true;
                    signal(rustix::process::Signal::TERM);
                    signal(rustix::process::Signal::CONT);
                    kill_at.get_or_insert(tokio::time::Instant::now() + host.config.stop_grace);
                }
                Some(Control::Kill) | None => {
                    ended_by_us = true;
                    signal(rustix::process::Signal::KILL);
                }
                Some(Control::Drop) => {
                    dropped = true;
                    signal(rustix::process::Signal::KILL);
                }
                Some(Control::Pause) => {
                    signal(rustix::process::Signal::STOP);
                    let _ = host.report(&w.worker_id, v1::report_worker::Report::Paused(true)).await;
                }
                Some(Control::Resume) => {
                    signal(rustix::process::Signal::CONT);
                    let _ = host.report(&w.worker_id, v1::report_worker::Report::Running(true)).await;
                }
            },
            () = grace_over => {
                signal(rustix::process::Signal::KILL);
                kill_at = None;
            }
        }
    };
    // What it left behind in its group goes with it (and lets its pipes close).
    signal(rustix::process::Signal::KILL);
    writer.abort();
    let within = |task: Option<tokio::task::JoinHandle<String>>| async move {
        match task {
            Some(task) => tokio::time::timeout(Duration::from_secs(2), task).await.ok().and_then(Result::ok).unwrap_or_default(),
            None => String::new(),
        }
    };
    if let Some(logger) = logger {
        let _ = tokio::time::timeout(Duration::from_secs(2), logger).await;
    }
    let result = within(result).await;
    if dropped {
        tracing::warn!(worker_id = w.worker_id, "Worker dropped: it is no longer this host's");
        return Ok(());
    }
    let status = status.map_err(|e| format!("lost track of the runner: {e}"))?;
    let state = if ended_by_us {
        WorkerState::Killed
    } else if status.success() {
        WorkerState::Succeeded
    } else {
        WorkerState::Failed
    };
    tracing::info!(worker_id = w.worker_id, state = state.as_str(), code = ?status.code(), "Worker ended");
    let end = v1::WorkerEnd { state: state.as_str().to_owned(), exit_code: status.code(), result };
    let _ = host.report(&w.worker_id, v1::report_worker::Report::Finished(end)).await;
    Ok(())
}

/// Reports what the runner writes on stderr, a line at a time, in batches (at most every
/// quarter second).
async fn log_lines(host: Arc<Host>, worker_id: String, stderr: tokio::process::ChildStderr) -> String {
    let mut lines = BufReader::new(stderr).lines();
    let mut batch: Vec<String> = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            line = lines.next_line() => match line {
                Ok(Some(line)) => {
                    batch.push(line);
                    if batch.len() >= LOG_LINES {
                        let _ = host.report(&worker_id, v1::report_worker::Report::Log(v1::LogLines { lines: std::mem::take(&mut batch) })).await;
                    }
                }
                _ => break,
            },
            _ = tick.tick() => {
                if !batch.is_empty() {
                    let _ = host.report(&worker_id, v1::report_worker::Report::Log(v1::LogLines { lines: std::mem::take(&mut batch) })).await;
                }
            }
        }
    }
    if !batch.is_empty() {
        let _ = host.report(&worker_id, v1::report_worker::Report::Log(v1::LogLines { lines: batch })).await;
    }
    String::new()
}

/// What the runner writes on stdout, up to the result's bound (the rest is read and
/// dropped, so the runner never blocks on a full pipe).
async fn read_result(mut stdout: tokio::process::ChildStdout) -> String {
    let room = RESULT_CHARS * 4;
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match stdout.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let take = n.min(room.saturating_sub(kept.len()));
                kept.extend_from_slice(&buf[..take]);
            }
        }
    }
    String::from_utf8_lossy(&kept).chars().take(RESULT_CHARS).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn r_host_1_a_bundle_is_used_only_when_its_bytes_give_its_digest_and_name_its_box() {
        let manifest: BoxManifest = serde_json::from_value(serde_json::json!({"box_type": "notes", "purpose": "write notes"})).expect("manifest");
        let bytes = atasira_domain::worker::bundle_bytes("b1", &manifest);
        let digest = atasira_domain::worker::bundle_digest("b1", &manifest);
        assert_eq!(verify_bundle(&digest, "b1", &bytes).map(|m| m.purpose), Ok("write notes".to_owned()));
        let mut tampered = bytes.clone();
        let last = tampered.len() - 3;
        tampered[last] ^= 1;
        assert!(verify_bundle(&digest, "b1", &tampered).expect_err("tampered").contains("not the digest"));
        assert!(verify_bundle(&digest, "b2", &bytes).expect_err("another Box").contains("another Box"));
    }
}
