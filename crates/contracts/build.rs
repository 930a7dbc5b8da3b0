//! Compiles every `.proto` file under `proto/atasira/v1` with protox (pure Rust, no system
//! `protoc`; it bundles the google/protobuf well-known types) and prost-build.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Read when the script runs (not baked in when it is compiled), so a target directory
    // shared by several checkouts still compiles each checkout's own files.
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR")?;
    let root = std::path::Path::new(&manifest_dir).join("../../proto");
    let dir = root.join("atasira/v1");
    let mut files: Vec<String> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|name| name.ends_with(".proto"))
        .map(|name| format!("atasira/v1/{name}"))
        .collect();
    files.sort();
    let descriptors = protox::compile(&files, [&root])?;
    // Maps as BTreeMap: deterministic encoding, and the domain's own map type.
    prost_build::Config::new().btree_map(["."]).compile_fds(descriptors)?;
    println!("cargo:rerun-if-changed={}", dir.display());
    for f in &files {
        println!("cargo:rerun-if-changed={}", root.join(f).display());
    }
    Ok(())
}
