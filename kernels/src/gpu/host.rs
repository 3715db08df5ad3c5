//! The host side of the kernels' error contract: decoding the stream status words kernels report
//! errors in ([`status_error`]; codes as `ERR_*` in the kernel sources). Stream state itself
//! (buffers kept alive while queued) lives in the shared GPU runtime, `tessera-gpu`.

use super::codes::ErrCode;
use tessera_core::Error;

/// The error in a stream's status words (`int[2]`: error code, value; see `raise_error` in
/// `common.cuh`), if a kernel raised one on `device`.
pub fn status_error(device: &str, words: [u8; 8]) -> Option<Error> {
    let code = i32::from_ne_bytes([words[0], words[1], words[2], words[3]]);
    let value = i32::from_ne_bytes([words[4], words[5], words[6], words[7]]);
    (code != 0).then(|| Error::Compute {
        device: device.to_string(),
        reason: match ErrCode::of(code) {
            Some(ErrCode::Expert) => {
                format!("MUL_MAT_ID/ADD_ID: expert id {value} is out of range")
            }
            Some(ErrCode::Index) => format!("GET_ROWS/SET_ROWS: row index {value} is out of range"),
            None => format!(
                "a kernel raised error code {code} (value {value}), which no kernel defines"
            ),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_words_decode() {
        assert!(status_error("GPU0", [0; 8]).is_none());
        let mut w = [0u8; 8];
        w[..4].copy_from_slice(&1i32.to_ne_bytes());
        w[4..].copy_from_slice(&(-3i32).to_ne_bytes());
        let e = status_error("GPU0", w).unwrap().to_string();
        assert!(
            e.contains("GPU0") && e.contains("-3") && e.contains("row"),
            "{e}"
        );
        w[..4].copy_from_slice(&2i32.to_ne_bytes());
        let e = status_error("GPU0", w).unwrap().to_string();
        assert!(e.contains("expert id -3"), "{e}");
    }
}
