//! Tokens for Slurm's REST API (`scontrol token`, slurmrestd's `X-SLURM-USER-TOKEN`): JSON Web
//! Tokens signed with HMAC-SHA256, as Slurm's `auth/jwt` makes them (`{"exp", "iat", "sun"}`).
//! The key is derived from the cluster's member secret (`join_token` in every node.toml), so any
//! node signs and `corral restd` on any node checks, with nothing replicated. Pure.

/// Why a token is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("malformed token")]
    Malformed,
    #[error("bad token signature")]
    Signature,
    #[error("token expired")]
    Expired,
}

/// The signing key of a cluster whose member secret is `secret`.
pub fn key(secret: &str) -> ring::hmac::Key {
    let mut material = b"corral rest api token key v1\0".to_vec();
    material.extend_from_slice(secret.as_bytes());
    ring::hmac::Key::new(ring::hmac::HMAC_SHA256, ring::digest::digest(&ring::digest::SHA256, &material).as_ref())
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Base64url without padding.
fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}

fn decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut n, mut bits) = (0u32, 0u32);
    for c in text.bytes() {
        let v = ALPHABET.iter().position(|a| *a == c)? as u32;
        n = n << 6 | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((n >> bits & 0xff) as u8);
        }
    }
    Some(out)
}

/// A token for `user`, issued at `now_s`, good until `exp_s`.
pub fn sign(key: &ring::hmac::Key, user: &str, now_s: u64, exp_s: u64) -> String {
    let header = encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let claims = encode(serde_json::json!({"exp": exp_s, "iat": now_s, "sun": user}).to_string().as_bytes());
    let signed = format!("{header}.{claims}");
    let tag = ring::hmac::sign(key, signed.as_bytes());
    format!("{signed}.{}", encode(tag.as_ref()))
}

/// The user a token names, if `key` signed it and it has not expired at `now_s`.
pub fn verify(key: &ring::hmac::Key, token: &str, now_s: u64) -> Result<String, TokenError> {
    if token.len() > 4096 {
        return Err(TokenError::Malformed);
    }
    let (signed, tag) = token.rsplit_once('.').ok_or(TokenError::Malformed)?;
    let tag = decode(tag).ok_or(TokenError::Malformed)?;
    ring::hmac::verify(key, signed.as_bytes(), &tag).map_err(|_| TokenError::Signature)?;
    let (header, claims) = signed.split_once('.').ok_or(TokenError::Malformed)?;
    let header: serde_json::Value =
        serde_json::from_slice(&decode(header).ok_or(TokenError::Malformed)?).map_err(|_| TokenError::Malformed)?;
    if header["alg"] != "HS256" {
        return Err(TokenError::Malformed);
    }
    let claims: serde_json::Value =
        serde_json::from_slice(&decode(claims).ok_or(TokenError::Malformed)?).map_err(|_| TokenError::Malformed)?;
    let exp = claims["exp"].as_u64().ok_or(TokenError::Malformed)?;
    if exp <= now_s {
        return Err(TokenError::Expired);
    }
    claims["sun"].as_str().filter(|u| !u.is_empty()).map(str::to_string).ok_or(TokenError::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64url_round_trips_every_length() {
        for len in 0..40u8 {
            let bytes: Vec<u8> = (0..len).map(|i| i.wrapping_mul(37).wrapping_add(251)).collect();
            assert_eq!(decode(&encode(&bytes)).as_deref(), Some(&bytes[..]), "length {len}");
        }
        // RFC 4648's examples, unpadded.
        assert_eq!(encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(encode(b"fo"), "Zm8");
        assert_eq!(decode("Zm9vYg").as_deref(), Some(&b"foob"[..]));
        assert_eq!(decode("a+b"), None);
    }

    #[test]
    fn a_token_names_its_user_until_it_expires_and_only_under_its_key() {
        let k = key("cluster secret");
        let token = sign(&k, "alice", 1_000, 2_800);
        assert_eq!(token.split('.').count(), 3);
        assert_eq!(verify(&k, &token, 1_001), Ok("alice".to_string()));
        assert_eq!(verify(&k, &token, 2_800), Err(TokenError::Expired));
        assert_eq!(verify(&key("another cluster"), &token, 1_001), Err(TokenError::Signature));
        let (signed, _) = token.rsplit_once('.').expect("three parts");
        let forged = sign(&key("x"), "root", 1_000, 9_999);
        assert_eq!(
            verify(&k, &format!("{}.{}", signed.replace("alice", "root"), forged.rsplit('.').next().unwrap_or("")), 1_001),
            Err(TokenError::Signature)
        );
        assert_eq!(verify(&k, "not a token", 1), Err(TokenError::Malformed));
    }
}
