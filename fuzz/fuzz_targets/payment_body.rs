fn main() {
    afl::fuzz!(|data: &[u8]| routerd::fuzzing::payment_body(data));
}
