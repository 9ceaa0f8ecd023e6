fn main() {
    afl::fuzz!(|data: &[u8]| routerd::fuzzing::api_keys(data));
}
