//! Reading text inputs the way an editor shows them: byte-order marks and line numbers.

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

#[cfg(test)]
mod tests {
    use super::*;

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
