//! rclone and s5cmd against the store: `rclone sync` and `rclone check` of a photo folder with
//! sidecars, and `s5cmd cp` of many files in parallel.

use std::process::Command;

use super::{S3Store, clean_env, photo_folder, tree};

/// Runs `cmd`; panics with its output and the server's log when it fails. Returns stdout.
fn run(s3: &S3Store, mut cmd: Command) -> String {
    let out = cmd
        .output()
        .expect("running an S3 client (tools/setup.sh installs it)");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        s3.inst.log()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// rclone with an anonymous S3 remote `nd:` at the store (from the environment alone).
fn rclone(s3: &S3Store, args: &[&str]) -> Command {
    let mut cmd = clean_env(Command::new("rclone"));
    cmd.env("RCLONE_CONFIG", "/nonexistent")
        .env("RCLONE_CONFIG_ND_TYPE", "s3")
        .env("RCLONE_CONFIG_ND_PROVIDER", "Other")
        .env("RCLONE_CONFIG_ND_ENDPOINT", &s3.endpoint)
        .env("RCLONE_CONFIG_ND_FORCE_PATH_STYLE", "true")
        .args(args);
    cmd
}

#[tokio::test]
async fn rclone_syncs_and_checks_a_photo_folder_and_s5cmd_copies_many_files_at_once() {
    let s3 = S3Store::start(&[]);
    let work = tempfile::tempdir().unwrap();
    let folder = work.path().join("folder");
    photo_folder(&folder);
    let src = folder.to_str().unwrap();
    run(&s3, rclone(&s3, &["mkdir", "nd:library"]));
    run(&s3, rclone(&s3, &["sync", src, "nd:library/2024"]));
    run(&s3, rclone(&s3, &["check", src, "nd:library/2024"]));
    std::fs::remove_file(folder.join("index.json")).unwrap();
    run(&s3, rclone(&s3, &["sync", src, "nd:library/2024"]));
    run(&s3, rclone(&s3, &["check", src, "nd:library/2024"]));
    let back = work.path().join("back");
    run(
        &s3,
        rclone(&s3, &["sync", "nd:library/2024", back.to_str().unwrap()]),
    );
    assert_eq!(tree(&back), tree(&folder));

    let many = work.path().join("many");
    std::fs::create_dir_all(&many).unwrap();
    for i in 0..40 {
        std::fs::write(many.join(format!("{i:02}.json")), format!("{{\"n\": {i}}}")).unwrap();
    }
    let mut s5 = clean_env(Command::new("s5cmd"));
    s5.args([
        "--no-sign-request",
        "--endpoint-url",
        &s3.endpoint,
        "--numworkers",
        "8",
    ])
    .args(["cp", &format!("{}/*", many.display()), "s3://library/many/"]);
    run(&s3, s5);
    let mut ls = clean_env(Command::new("s5cmd"));
    ls.args(["--no-sign-request", "--endpoint-url", &s3.endpoint])
        .args(["ls", "s3://library/many/*"]);
    let listed = run(&s3, ls);
    assert_eq!(listed.lines().count(), 40, "{listed}");
}
