//! Broken sources refuse to mount with a message naming the file, tensor and rule.
//! The corpus (and the expected message of each case) comes from tools/make_bad_gguf.py.

mod common;

use std::process::Command;

use common::*;

#[test]
fn every_broken_source_is_refused_with_its_rule() {
    let corpus = tempfile::tempdir().unwrap();
    run_ok(python().arg(repo().join("tools/make_bad_gguf.py")).arg(corpus.path()));
    let cases: Vec<serde_json::Value> = serde_json::from_slice(&std::fs::read(corpus.path().join("cases.json")).unwrap()).unwrap();
    assert!(cases.len() >= 40);
    let mnt = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for case in &cases {
        let file = corpus.path().join(case["file"].as_str().unwrap());
        let expect = case["expect"].as_str().unwrap();
        let opts: Vec<&str> = case["options"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        let out = Command::new(bin()).arg("mount").arg(&file).arg(mnt.path()).args(["-o", "digest_store=none"]).args(&opts).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            let _ = Command::new("umount").arg(mnt.path()).status();
            failures.push(format!("{}: mounted", file.display()));
        } else if out.status.code() != Some(1) || !stderr.contains(expect) {
            failures.push(format!("{}: exit {:?}, expected {expect:?} in: {stderr}", file.display(), out.status.code()));
        } else if !opts.is_empty() || expect.contains("option") {
            // Option errors name the option; file errors name the file.
        } else {
            assert!(stderr.contains(&*file.to_string_lossy()) || stderr.contains("expert-pack:"), "{stderr}");
        }
    }
    assert!(mounts_line(mnt.path()).is_none());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // And the well-formed file of the corpus mounts.
    let m = Mount::new(&corpus.path().join("good.gguf"), &[]);
    assert_eq!(std::fs::metadata(m.path("good.pack")).unwrap().len(), 40960);
    m.unmount();
}
