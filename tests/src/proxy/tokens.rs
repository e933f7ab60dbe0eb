//! Finding lock tokens in the request bytes a proxy forwards.

const TOKEN_PREFIX: &[u8] = b"$32\r\n";
const TOKEN_FRAME: usize = TOKEN_PREFIX.len() + 32 + 2;

/// Finds the RESP bulk strings of exactly 32 lowercase hex digits (lock tokens)
/// that end in `data`. `carry` keeps the tail of the previous chunk, so a token
/// split across two reads is found once.
pub(super) fn scan_tokens(carry: &mut Vec<u8>, data: &[u8]) -> Vec<String> {
    let mut buf = std::mem::take(carry);
    let old = buf.len();
    buf.extend_from_slice(data);
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(p) = buf[i..]
        .windows(TOKEN_PREFIX.len())
        .position(|w| w == TOKEN_PREFIX)
    {
        let start = i + p + TOKEN_PREFIX.len();
        let end = start + 32;
        if end + 2 > buf.len() {
            break;
        }
        let token = &buf[start..end];
        if end + 2 > old
            && token
                .iter()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
            && &buf[end..end + 2] == b"\r\n"
        {
            out.push(String::from_utf8_lossy(token).into_owned());
        }
        i += p + 1;
    }
    let keep = buf.len().saturating_sub(TOKEN_FRAME - 1);
    *carry = buf[keep..].to_vec();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_found_once_across_chunk_boundaries() {
        let token = "0123456789abcdef0123456789abcdef";
        let frame = format!("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$32\r\n{token}\r\n$2\r\nPX\r\n");
        let bytes = frame.as_bytes();
        for split in 0..bytes.len() {
            let mut carry = Vec::new();
            let mut found = scan_tokens(&mut carry, &bytes[..split]);
            found.extend(scan_tokens(&mut carry, &bytes[split..]));
            assert_eq!(found, vec![token.to_owned()], "split at {split}");
        }
        let mut carry = Vec::new();
        assert!(scan_tokens(&mut carry, b"$32\r\n0123456789ABCDEF0123456789abcdef\r\n").is_empty());
        assert!(
            scan_tokens(
                &mut carry,
                b"$40\r\n0123456789abcdef0123456789abcdef01234567\r\n"
            )
            .is_empty()
        );
    }
}
