//! `meshsim plot` and `meshsim compare`: tools over results folders.

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use super::{EXIT_BAD_INPUT, EXIT_FAILED, refused};
use meshsim::results::output;

pub(crate) fn compare(sim: &Path, live: &Path, out: Option<&Path>, json: bool) -> ExitCode {
    let replaces = output::Replaces::Header(if json {
        output::COMPARISON_JSON_HEADER
    } else {
        output::COMPARISON_HEADER
    });
    if let Some(path) = out
        && let Err(e) =
            output::check_out_file(path, replaces).and_then(|()| output::probe_beside(path))
    {
        return refused(e);
    }
    let md = match meshsim::results::compare::comparison(sim, live) {
        Ok(c) if json => c.json(),
        Ok(c) => c.markdown(),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    match out {
        Some(path) => {
            if let Err(e) =
                output::write_file_atomically(path, replaces, |w| w.write_all(md.as_bytes()))
            {
                eprintln!("error: {e}");
                return ExitCode::from(EXIT_FAILED);
            }
        }
        None => print!("{md}"),
    }
    ExitCode::SUCCESS
}

pub(crate) fn plot(dir: &Path, quiet: bool) -> ExitCode {
    let started = Instant::now();
    let names = meshsim::results::plot::output_files(dir);
    if let Err(e) = output::check_results_files(dir, &names) {
        return refused(e);
    }
    match meshsim::results::plot::render(dir) {
        Ok(files) => {
            if !quiet {
                println!(
                    "wrote {} files into {} in {:.3} s: {}",
                    files.len(),
                    dir.display(),
                    started.elapsed().as_secs_f64(),
                    files
                        .iter()
                        .filter_map(|f| f.file_name())
                        .map(|f| f.to_string_lossy())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(if e.is_bad_input() {
                EXIT_BAD_INPUT
            } else {
                EXIT_FAILED
            })
        }
    }
}
