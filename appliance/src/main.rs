//! The `airlock` binary: a thin shell over the library.

fn main() {
    println!("airlock {}", env!("CARGO_PKG_VERSION"));
}
