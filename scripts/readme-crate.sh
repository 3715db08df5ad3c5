#!/usr/bin/env bash
# A fresh crate, outside the workspace, that depends on the packaged crates as crates.io would
# serve them and runs the README's example and the book's serving example
# (docs/src/library.md, "Serving several sequences") verbatim: the names a user types, the
# package rename of the facade and the examples themselves are checked together.
#
#   scripts/readme-crate.sh [--check]
#
# Run after `cargo package --workspace` (CI's package stage): it unpacks target/package/*.crate
# into target/readme-crate/crates/ and points `[patch.crates-io]` at them, so nothing is taken
# from crates.io under a Tessera name even where one exists there. The example's `?` run inside a
# `main` returning a boxed error, as a user would paste it. --check type-checks instead of
# building and running (a quicker look while editing).
set -euo pipefail
cd "$(dirname "$0")/.."

mode=run
case "${1:-}" in
  --check) mode=check ;;
  "") ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

root=$PWD
out=$root/target/readme-crate
rm -rf "$out/crates" "$out/app/src"
mkdir -p "$out/crates" "$out/app/src"

# Every package meant for publishing, with its version.
mapfile -t pkgs < <(cargo metadata --no-deps --format-version 1 --locked |
  python3 -c 'import json, sys
for p in json.load(sys.stdin)["packages"]:
    if p.get("publish") != []:
        print(p["name"], p["version"])')
[ "${#pkgs[@]}" -gt 0 ] || { echo "no publishable packages" >&2; exit 1; }

patch=""
for entry in "${pkgs[@]}"; do
  read -r name version <<<"$entry"
  crate=$root/target/package/$name-$version.crate
  [ -f "$crate" ] || { echo "$crate is missing: run cargo package --workspace first" >&2; exit 1; }
  tar -xzf "$crate" -C "$out/crates"
  patch+="$name = { path = '$out/crates/$name-$version' }"$'\n'
done

facade_version=$(printf '%s\n' "${pkgs[@]}" | awk '$1 == "tessera-rs" { print $2 }')
[ -n "$facade_version" ] || { echo "the facade package tessera-rs is not publishable" >&2; exit 1; }

# The README's dependency line and first Rust block, as written; the book's tessera-model line
# and its serving example.
python3 - "$root/README.md" "$out/app" "$patch" "$root/docs/src/library.md" <<'EOF'
import re, sys
readme, app, patch, book = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
text = open(readme, encoding="utf-8").read()
book_text = open(book, encoding="utf-8").read()
model_dep = re.search(r"^tessera-model = .*$", book_text, re.M)
serving = re.search(r"## Serving several sequences\n.*?```rust\n(.*?)```", book_text, re.S)
if not model_dep or not serving:
    sys.exit("docs/src/library.md: no tessera-model dependency line or serving example")
toml = re.search(r"```toml\n(.*?)```", text, re.S)
rust = re.search(r"```rust\n(.*?)```", text, re.S)
if not toml or not rust:
    sys.exit("README.md: no ```toml or ```rust block")
deps = toml.group(1)
if "[dependencies]" not in deps:
    sys.exit("README.md: the ```toml block has no [dependencies]")
with open(f"{app}/Cargo.toml", "w") as f:
    f.write('[package]\nname = "readme-example"\nversion = "0.0.0"\nedition = "2024"\npublish = false\n\n')
    f.write("[workspace]\n\n")
    f.write(deps)
    f.write(model_dep.group(0).split("#")[0].strip() + "\n")
    f.write("\n[patch.crates-io]\n" + patch)
body = "".join("    " + l if l.strip() else l for l in rust.group(1).splitlines(True))
with open(f"{app}/src/main.rs", "w") as f:
    f.write("#![allow(unused)]\n\nfn main() -> Result<(), Box<dyn std::error::Error>> {\n")
    f.write(body)
    f.write("    println!(\"README example ran\");\n    Ok(())\n}\n")
import os
os.makedirs(f"{app}/src/bin", exist_ok=True)
body = "".join("    " + l if l.strip() else l for l in serving.group(1).splitlines(True))
with open(f"{app}/src/bin/serving.rs", "w") as f:
    f.write("#![allow(unused)]\n\nfn main() -> Result<(), Box<dyn std::error::Error>> {\n")
    f.write(body)
    f.write("    println!(\"book serving example ran\");\n    Ok(())\n}\n")
EOF

# The workspace's lock pins the same third-party versions CI tested.
cp Cargo.lock "$out/app/Cargo.lock"
cd "$out/app"
export CARGO_TARGET_DIR=$out/target
if [ "$mode" = check ]; then
  cargo check --quiet --bins
else
  cargo run --quiet --release --bin readme-example
  cargo run --quiet --release --bin serving
fi
