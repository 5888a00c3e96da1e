//! Reading text inputs the way an editor shows them: byte-order marks and line numbers; and
//! reading a user's file within a bound ([`read_capped`]).

use std::io::Read;
use std::path::Path;

/// Most bytes meshsim reads from a trace, a dataset or a results CSV file (4 GiB): the
/// largest public traces and datasets it replays are tens to hundreds of MiB, and a results
/// folder of 10 M requests (the most a scenario may ask for) about 1 GiB.
pub const MAX_DATA_BYTES: u64 = 4 << 30;

/// Most bytes meshsim reads from a scenario, a profile, a share's manifest, a cookie or a
/// tokenizer (64 MiB; a large tokenizer.json is tens of MiB, a scenario a few KiB).
pub const MAX_CONFIG_BYTES: u64 = 64 << 20;

/// The UTF-8 byte-order mark that some editors put at the start of a text file.
pub const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// The line (1-based, as an editor counts it) of the record that csv places at `pos`.
/// csv's own line count lags behind: it consumes the blank lines and the `\n` of a `\r\n`
/// that precede a record only when it reads that record, after noting its position. So the
/// lines are counted up to the record's first byte.
pub fn record_line(bytes: &[u8], pos: &csv::Position) -> u64 {
    let mut start = (pos.byte() as usize).min(bytes.len());
    while bytes.get(start).is_some_and(|b| matches!(b, b'\r' | b'\n')) {
        start += 1;
    }
    1 + bytes[..start].iter().filter(|&&b| b == b'\n').count() as u64
}

/// The bytes of the file at `path`, at most `max`, so that no input grows memory without
/// bound: a regular file larger than `max` is refused by its size before any read; a pipe
/// (a shell's `<(zcat trace.gz)`) is read up to one byte past `max`; a character or block
/// device (`/dev/zero`, a disk) is refused without a read, as it is not a file of data.
pub fn read_capped(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    let f = std::fs::File::open(path)?;
    let meta = f.metadata()?;
    let kind = meta.file_type();
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_char_device() || kind.is_block_device() {
            return Err(std::io::Error::other(
                "it is a device, not a file; give a file (or a pipe)",
            ));
        }
    }
    if kind.is_file() && meta.len() > max {
        return Err(std::io::Error::other(format!(
            "it is {}, larger than the {} meshsim reads from such a file",
            bytes_text(meta.len()),
            bytes_text(max)
        )));
    }
    let mut bytes = Vec::new();
    if kind.is_file() {
        bytes.reserve_exact(meta.len() as usize);
    }
    f.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(std::io::Error::other(format!(
            "it holds more than the {} meshsim reads from such a file",
            bytes_text(max)
        )));
    }
    Ok(bytes)
}

/// [`read_capped`] as text (UTF-8), for the readers that take a `String`.
pub fn read_capped_string(path: &Path, max: u64) -> std::io::Result<String> {
    String::from_utf8(read_capped(path, max)?).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not valid UTF-8 (byte {})", e.utf8_error().valid_up_to()),
        )
    })
}

/// `n` bytes as people write them: `4 GiB`, `64 MiB`, `12 bytes`.
fn bytes_text(n: u64) -> String {
    match n {
        n if n >= 1 << 30 && n.is_multiple_of(1 << 30) => format!("{} GiB", n >> 30),
        n if n >= 1 << 20 && n.is_multiple_of(1 << 20) => format!("{} MiB", n >> 20),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n => format!("{n} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Linux: it reads `/dev/zero` and a pipe through `/proc/self/fd`.
    #[test]
    #[cfg(target_os = "linux")]
    fn capped_reads_refuse_large_files_devices_and_long_pipes() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, b"0123456789").unwrap();
        assert_eq!(read_capped(&f, 10).unwrap(), b"0123456789");
        let e = read_capped(&f, 9).unwrap_err().to_string();
        assert_eq!(
            e,
            "it is 10 bytes, larger than the 9 bytes meshsim reads from such a file"
        );
        let e = read_capped(Path::new("/dev/zero"), 1 << 20).unwrap_err();
        assert!(e.to_string().contains("it is a device"), "{e}");
        // A pipe is read up to one byte past the bound, not to its end.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "yes 0123456789abcdef"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let fd = child.stdout.as_ref().map(|o| {
            use std::os::fd::AsRawFd;
            o.as_raw_fd()
        });
        let path = format!("/proc/self/fd/{}", fd.unwrap());
        let e = read_capped(Path::new(&path), 1 << 20)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "it holds more than the 1 MiB meshsim reads from such a file"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(read_capped(dir.path(), 1 << 20).is_err(), "a folder");
        assert_eq!(read_capped_string(&f, 10).unwrap(), "0123456789");
        std::fs::write(&f, b"\xff").unwrap();
        let e = read_capped_string(&f, 10).unwrap_err().to_string();
        assert_eq!(e, "not valid UTF-8 (byte 0)");
    }

    #[test]
    fn record_lines_are_counted_as_an_editor_shows_them() {
        // A blank line and Windows line ends: csv notes each record's position before it
        // consumes the line ends in front of it.
        let text = b"a,b\r\n1,2\r\n\r\n3,4\r\n5,x\r\n";
        let mut rd = csv::Reader::from_reader(&text[..]);
        let lines: Vec<u64> = rd
            .records()
            .map(|r| record_line(text, r.unwrap().position().unwrap()))
            .collect();
        assert_eq!(lines, vec![2, 4, 5]);
        let text = b"a,b\n1,2\n3,4\n";
        let mut rd = csv::Reader::from_reader(&text[..]);
        let lines: Vec<u64> = rd
            .records()
            .map(|r| record_line(text, r.unwrap().position().unwrap()))
            .collect();
        assert_eq!(lines, vec![2, 3]);
    }
}
