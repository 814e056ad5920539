//! Standard Webhooks signatures: a secret `whsec_<base64>`, and for each delivery the
//! headers `webhook-id`, `webhook-timestamp` and `webhook-signature`, the last being
//! `v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">` under each secret in use (the new
//! and, while a rotation's grace lasts, the previous one), separated by spaces.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The prefix of every signing secret.
const PREFIX: &str = "whsec_";

/// A new signing secret: `whsec_` and 32 random bytes in base64.
pub(crate) fn new_secret() -> String {
    let bytes: Vec<u8> = (0..2)
        .flat_map(|_| uuid::Uuid::new_v4().into_bytes())
        .collect();
    format!("{PREFIX}{}", STANDARD.encode(bytes))
}

/// The `webhook-signature` value of `body`, sent as `id` at `timestamp` (Unix seconds),
/// under each of `secrets`; `None` if one is not a signing secret.
pub(crate) fn signature(secrets: &[&str], id: &str, timestamp: i64, body: &str) -> Option<String> {
    let mut signatures = Vec::with_capacity(secrets.len());
    for secret in secrets {
        let key = STANDARD.decode(secret.strip_prefix(PREFIX)?).ok()?;
        let mut mac = Hmac::<Sha256>::new_from_slice(&key).ok()?;
        mac.update(format!("{id}.{timestamp}.").as_bytes());
        mac.update(body.as_bytes());
        signatures.push(format!(
            "v1,{}",
            STANDARD.encode(mac.finalize().into_bytes())
        ));
    }
    Some(signatures.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_specifications_example_signs_alike() {
        // The example of the Standard Webhooks specification.
        let signed = signature(
            &["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            r#"{"test": 2432232314}"#,
        );
        assert_eq!(
            signed.as_deref(),
            Some("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
        );
    }

    #[test]
    fn two_secrets_sign_twice_and_a_bad_secret_signs_nothing() {
        let (old, new) = (new_secret(), new_secret());
        assert_ne!(old, new);
        assert!(
            old.starts_with("whsec_") && STANDARD.decode(&old[6..]).is_ok_and(|k| k.len() == 32)
        );
        let both = signature(&[&new, &old], "m", 1, "{}").expect("signed");
        let parts: Vec<&str> = both.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(Some(parts[0]), signature(&[&new], "m", 1, "{}").as_deref());
        assert_eq!(signature(&["nope"], "m", 1, "{}"), None);
    }
}
