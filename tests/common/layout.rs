//! Checking generated ABI types against an installed C header: a C program
//! prints the size, alignment or offset of every struct and field, and the
//! value of every constant, and each is compared with Rust's view. A missing
//! header or compiler is a failure.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

/// A size or offset, as the C program prints it.
pub fn wide(n: usize) -> i128 {
    i128::try_from(n).expect("sizes fit in i128")
}

/// `("sizeof(struct T)", size)` and `("_Alignof(struct T)", align)`.
#[macro_export]
macro_rules! layout {
    ($kind:literal $ty:ident) => {
        [
            (
                concat!("sizeof(", $kind, " ", stringify!($ty), ")"),
                $crate::common::layout::wide(::std::mem::size_of::<$ty>()),
            ),
            (
                concat!("_Alignof(", $kind, " ", stringify!($ty), ")"),
                $crate::common::layout::wide(::std::mem::align_of::<$ty>()),
            ),
        ]
    };
}

/// `("offsetof(struct T, a.b)", offset)` for each field path, named the
/// same in C and Rust.
#[macro_export]
macro_rules! offsets {
    ($ty:ident { $($first:ident $(. $rest:ident)*),* $(,)? }) => {
        [$(
            (
                concat!(
                    "offsetof(struct ", stringify!($ty), ", ",
                    stringify!($first) $(, ".", stringify!($rest))*, ")"
                ),
                $crate::common::layout::wide(::std::mem::offset_of!($ty, $first $(. $rest)*)),
            ),
        )*]
    };
}

/// `("NAME", value)` for each constant of a bindgen enum module.
#[macro_export]
macro_rules! constants {
    ($module:ident { $($name:ident),* $(,)? }) => {
        [$( (stringify!($name), i128::from($module::$name)), )*]
    };
}

/// The C program printing `expression<TAB>value` for each expression.
fn program(header: &str, expressions: &[&str]) -> String {
    let mut c = format!(
        "#include <stddef.h>\n#include <stdio.h>\n#include <{header}>\n\n\
         int main(void)\n{{\n"
    );
    for e in expressions {
        c.push_str(&format!(
            "    printf(\"%s\\t%lld\\n\", \"{e}\", (long long)({e}));\n"
        ));
    }
    c.push_str("    return 0;\n}\n");
    c
}

/// Fails, naming the package, when `header` cannot be included.
fn require_header(header: &str, package: &str) {
    let mut child = Command::new("cc")
        .args(["-E", "-x", "c", "-o", "/dev/null", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run cc (a C toolchain is required): {e}"));
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(format!("#include <{header}>\n").as_bytes())
        .expect("writing to cc");
    let out = child.wait_with_output().expect("waiting for cc");
    assert!(
        out.status.success(),
        "<{header}> is not installed: install the {package} package \
         (scripts/setup.sh does). cc said:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Compiles a program including `header` (of `package`) that prints every
/// expression of `expected`, and fails listing each value that differs from
/// Rust's; `generated` names the Rust file and the script that writes it.
pub fn check(header: &str, package: &str, generated: &str, expected: &[(&'static str, i128)]) {
    require_header(header, package);
    let name = header.replace(['/', '.'], "_");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).expect("creating the test directory");
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    let names: Vec<&str> = expected.iter().map(|(e, _)| *e).collect();
    std::fs::write(&src, program(header, &names)).expect("writing layout.c");
    super::compile_c::<&str>(&src, &exe, &[]);
    let out = super::run_with_timeout(&mut Command::new(&exe), std::time::Duration::from_secs(60));
    assert!(out.status.success(), "{} failed: {out:?}", exe.display());
    let stdout = String::from_utf8(out.stdout).expect("the program prints ASCII");
    let c: BTreeMap<&str, i128> = stdout
        .lines()
        .map(|line| {
            let (expr, value) = line.split_once('\t').expect("expression<TAB>value");
            (expr, value.parse().expect("a number"))
        })
        .collect();
    let mismatches: Vec<String> = expected
        .iter()
        .filter(|(expr, rust)| c.get(expr) != Some(rust))
        .map(|(expr, rust)| format!("{expr}: C {:?}, Rust {rust}", c.get(expr)))
        .collect();
    assert!(
        mismatches.is_empty(),
        "{generated} differs from the installed {header} (regenerate it, or check the \
         rdma-core version):\n{}",
        mismatches.join("\n")
    );
    assert_eq!(c.len(), expected.len(), "each expression checked once");
}
