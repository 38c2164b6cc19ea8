//! Security messages (frame type 2): `LOGIN` and `AUTHENTICATE`, for a fixture with a user.
//!
//! A message body is a 16-byte header (`[0, 0, command, field count, 0 × 12]`) and fields
//! (`u32 length including the id | u8 id | bytes`). The reply header carries the result code in
//! byte 1 and the field count in byte 3; a successful login answers a session token and its TTL.

use std::collections::HashSet;
use std::sync::Mutex;

use super::result_code as rc;
use super::wire;

const AUTHENTICATE: u8 = 0;
const LOGIN: u8 = 20;
const FIELD_USER: u8 = 0;
const FIELD_CREDENTIAL: u8 = 3;
const FIELD_SESSION_TOKEN: u8 = 5;
const FIELD_SESSION_TTL: u8 = 6;
/// Session TTL answered on login (one day, in seconds).
const SESSION_TTL_SECS: u32 = 86_400;
/// The salt every Aerospike client hashes passwords with (bcrypt, cost 10, `$2a$`).
const PASSWORD_SALT: [u8; 16] = [
    244, 107, 11, 190, 207, 254, 141, 27, 6, 103, 216, 79, 109, 193, 216, 169,
];

/// The one user a secured fixture knows, and the session tokens it handed out.
pub(crate) struct Security {
    user: String,
    /// The bcrypt hash the client sends as its credential; never the password itself.
    credential: String,
    tokens: Mutex<HashSet<Vec<u8>>>,
}

impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Security")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

impl Security {
    /// A user with this password (hashed as the clients do).
    pub(crate) fn new(user: &str, password: &str) -> std::io::Result<Self> {
        let credential = bcrypt::hash_with_salt(password, 10, PASSWORD_SALT)
            .map_err(|e| std::io::Error::other(format!("cannot hash the fixture password: {e}")))?
            .format_for_version(bcrypt::Version::TwoA);
        Ok(Security {
            user: user.to_owned(),
            credential,
            tokens: Mutex::new(HashSet::new()),
        })
    }
}

/// Answers one security message; `authenticated` is set when the connection logs in or
/// authenticates. Without `security` every login answers `SECURITY_NOT_ENABLED`, as a server
/// without security does.
pub(crate) fn answer(
    security: Option<&Security>,
    body: &[u8],
    authenticated: &mut bool,
) -> Vec<u8> {
    let reply = |code: u8, fields: &[(u8, &[u8])]| {
        let mut out = vec![0, code, 0, fields.len() as u8];
        out.resize(16, 0);
        for (id, data) in fields {
            out.extend_from_slice(&(data.len() as u32 + 1).to_be_bytes());
            out.push(*id);
            out.extend_from_slice(data);
        }
        wire::frame(wire::TYPE_ADMIN, &out)
    };
    if body.len() < 16 {
        return reply(rc::PARAMETER_ERROR, &[]);
    }
    let (command, count) = (body[2], body[3]);
    let mut fields = Vec::new();
    let mut at = 16;
    for _ in 0..count {
        let Some(len) = body
            .get(at..at + 4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
        else {
            return reply(rc::PARAMETER_ERROR, &[]);
        };
        let (Some(&id), Some(data)) = (body.get(at + 4), body.get(at + 5..at + 4 + len.max(1)))
        else {
            return reply(rc::PARAMETER_ERROR, &[]);
        };
        fields.push((id, data));
        at += 4 + len;
    }
    let field = |id: u8| fields.iter().find(|(i, _)| *i == id).map(|(_, d)| *d);
    let Some(security) = security else {
        return reply(rc::SECURITY_NOT_ENABLED, &[]);
    };
    match command {
        LOGIN => {
            let user_ok = field(FIELD_USER) == Some(security.user.as_bytes());
            let credential_ok = field(FIELD_CREDENTIAL) == Some(security.credential.as_bytes());
            if !(user_ok && credential_ok) {
                return reply(rc::INVALID_CREDENTIAL, &[]);
            }
            let token = uuid::Uuid::new_v4().as_bytes().to_vec();
            security
                .tokens
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(token.clone());
            *authenticated = true;
            reply(
                rc::OK,
                &[
                    (FIELD_SESSION_TOKEN, &token),
                    (FIELD_SESSION_TTL, &SESSION_TTL_SECS.to_be_bytes()),
                ],
            )
        }
        AUTHENTICATE => {
            let known = field(FIELD_SESSION_TOKEN).is_some_and(|t| {
                security
                    .tokens
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .contains(t)
            });
            if field(FIELD_USER) == Some(security.user.as_bytes()) && known {
                *authenticated = true;
                reply(rc::OK, &[])
            } else {
                reply(rc::NOT_AUTHENTICATED, &[])
            }
        }
        _ => reply(rc::PARAMETER_ERROR, &[]),
    }
}
