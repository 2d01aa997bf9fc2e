//! Records the git commit the binaries are built from (`ARGOCD_AGENT_GIT_COMMIT` at compile
//! time), shown by `argocd-agent --version` and `argocd-agentctl version`.
//!
//! Order: `git rev-parse --short=12 HEAD`; else the `ARGOCD_AGENT_GIT_COMMIT` environment
//! variable (container builds copy no `.git`, so the Dockerfile passes it as a build arg);
//! else `unknown`. Re-runs only when HEAD, the branch it points to or that variable changes.

use std::path::PathBuf;
use std::process::Command;

const ENV: &str = "ARGOCD_AGENT_GIT_COMMIT";

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed={ENV}");
    let from_git = git(&["rev-parse", "--short=12", "HEAD"]);
    if from_git.is_some() {
        // A worktree has its own HEAD (git dir) but shares refs (common dir).
        if let Some(dir) = git(&["rev-parse", "--path-format=absolute", "--git-dir"]) {
            println!(
                "cargo:rerun-if-changed={}",
                PathBuf::from(dir).join("HEAD").display()
            );
        }
        if let Some(common) = git(&["rev-parse", "--path-format=absolute", "--git-common-dir"]) {
            let common = PathBuf::from(common);
            println!(
                "cargo:rerun-if-changed={}",
                common.join("packed-refs").display()
            );
            if let Some(head_ref) = git(&["symbolic-ref", "-q", "HEAD"]) {
                println!("cargo:rerun-if-changed={}", common.join(head_ref).display());
            }
        }
    }
    let commit = from_git
        .or_else(|| std::env::var(ENV).ok().filter(|s| !s.trim().is_empty()))
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env={ENV}={commit}");
}
