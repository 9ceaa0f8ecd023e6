//! Replays the fuzzers' committed inputs (`fuzz/corpus/<target>/` and the crashes they found,
//! `fuzz/crashes/<target>/`) through `routerd::fuzzing`, as the fuzz targets run them: every
//! file must be read without a panic. `scripts/fuzz` runs the fuzzers that grow the corpus.

use std::path::{Path, PathBuf};

use routerd::fuzzing::TARGETS;

fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .filter(|p| {
            !p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .collect();
    files.sort();
    files
}

#[test]
fn every_corpus_and_crash_file_is_read_without_a_panic() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut failures = Vec::new();
    let mut replayed = 0;
    for (name, target) in TARGETS {
        let corpus = files(&fuzz.join("corpus").join(name));
        assert!(!corpus.is_empty(), "fuzz/corpus/{name}/ holds no inputs");
        for file in corpus
            .into_iter()
            .chain(files(&fuzz.join("crashes").join(name)))
        {
            let data = std::fs::read(&file).unwrap();
            replayed += 1;
            if let Err(panic) = std::panic::catch_unwind(|| target(&data)) {
                let message = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("(no message)")
                    .to_string();
                failures.push(format!("{name}: {}: {message}", file.display()));
            }
        }
    }
    // Every target the fuzz crate builds has a corpus here.
    let targets_dir = fuzz.join("fuzz_targets");
    for file in files(&targets_dir) {
        let stem = file.file_stem().unwrap().to_string_lossy().to_string();
        assert!(
            TARGETS.iter().any(|(name, _)| *name == stem),
            "fuzz/fuzz_targets/{stem}.rs is not in routerd::fuzzing::TARGETS"
        );
    }
    assert!(
        failures.is_empty(),
        "{} of {replayed} fuzz inputs panicked:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
