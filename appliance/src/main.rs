//! The `airlock` binary: a thin shell over the library's CLI.

fn main() -> std::process::ExitCode {
    airlock::cli::main()
}
