//! `docs/protocol.md` gives byte-exact examples so that a server can be
//! written from it alone: its example token, that token's CONNECT, and
//! the values of the grant and final immediates. These are what the code
//! computes. It also states limits a server and a security reader rely
//! on: those figures are the code's.

use hipobj::core::connections::MAX_WRONG_PROOFS;
use hipobj::core::options::Options;
use hipobj::core::protocol::{
    decode_stripes, encode_connect, encode_connect_v, encode_connect_v3, encode_proof_v3,
    encode_stripes, final_data, final_imm, grant_imm, Share, VERSION_4,
};
use hipobj::core::token::{Token, Transport};

const DOC: &str = include_str!("../docs/protocol.md");

/// The document's example: name 17, `::ffff:192.0.2.1`, window index
/// 0x251 with key byte 0xa7, 16 MiB at 0x7f2a5c000000, port 38908.
fn example() -> Token {
    Token {
        transport: Transport::RcCm,
        qp_num: 17,
        gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 1],
        rkey: 0x0002_51a7,
        addr: 0x7f2a_5c00_0000,
        length: 16 << 20,
        port: 0,
        lid: 38908,
        secret: 0x89ab_cdef,
    }
}

fn assert_documented(text: &str) {
    assert!(DOC.contains(text), "docs/protocol.md does not say:\n{text}");
}

#[test]
fn the_documented_example_token_is_what_the_codec_writes() {
    let hex = String::from_utf8(example().to_hex().to_vec()).unwrap();
    assert_documented(&hex);
    // Field by field, split at the documented offsets.
    let bytes = example().to_bytes();
    let fields: Vec<String> = [0, 1, 5, 21, 25, 33, 38, 42, 44]
        .windows(2)
        .map(|w| hex::encode(&bytes[w[0]..w[1]]))
        .collect();
    assert_documented(&fields.join(" "));
    assert_documented(&hex::encode(encode_connect(&example())));
    assert_documented(&format!("{hex}:00007f2a5c000000:0000000001000000"));
}

#[test]
fn the_documented_immediates_are_what_the_protocol_computes() {
    let grant = u32::from_le_bytes(*b"GRNT");
    let done = u32::from_le_bytes(*b"DONE");
    assert_documented(&format!("(grant, `0x{grant:08x}`)"));
    assert_documented(&format!("(final, `0x{done:08x}`)"));
    for secret in [0, 1, 0x1234_5678, 0x89ab_cdef, 0xffff_ffff] {
        assert_documented(&format!(
            "| `0x{secret:08x}` | `0x{:08x}` | `0x{:08x}` |",
            grant_imm(secret),
            final_imm(secret)
        ));
    }
}

#[test]
fn the_documented_version_4_messages_are_what_the_codec_writes() {
    let t = example();
    assert_documented(&hex::encode(encode_connect_v(VERSION_4, &t, 0, t.qp_num)));
    assert_documented(&format!(
        "For the example secret `0x{:08x}`:\n  `{}`",
        t.secret,
        hex::encode(final_data(t.secret))
    ));
}

#[test]
fn the_documented_version_3_messages_are_what_the_codec_writes() {
    let t = example();
    assert_documented(&hex::encode(encode_connect_v3(&t, 0, t.qp_num)));
    assert_documented(&hex::encode(encode_connect_v3(&t, 2, 0x19)));
    assert_documented(&hex::encode(encode_proof_v3(&t, 1)));
    let share = 4 << 20;
    let plan: Vec<Share> = [
        (0x11, 0x0002_51a7),
        (0x18, 0x0002_52c3),
        (0x19, 0x0002_534e),
        (0x1a, 0x0002_5410),
    ]
    .iter()
    .zip(0u64..)
    .map(|(&(name, rkey), i)| Share {
        name,
        rkey,
        addr: t.addr + i * share,
        len: share,
    })
    .collect();
    let bytes = encode_stripes(&plan);
    assert_documented(&hex::encode(&bytes));
    assert_eq!(
        decode_stripes(&bytes, &t),
        Ok(plan),
        "a valid plan for the token"
    );
}

#[test]
fn the_documented_limits_are_the_code_s() {
    assert_documented(&format!(
        "### {MAX_WRONG_PROOFS} wrong tokens end a waiting transfer"
    ));
    assert_documented(&format!(
        "the {MAX_WRONG_PROOFS}th refused connect request naming it ends the job"
    ));
    let deadline = Options::default().token_timeout.as_secs();
    assert_documented(&format!(
        "`HIPOBJ_TOKEN_TIMEOUT_MS` ({deadline} s) after it was minted"
    ));
    assert_documented("### A released token serves its server, once, until its deadline");
}
