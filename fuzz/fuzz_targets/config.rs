fn main() {
    afl::fuzz!(|data: &[u8]| routerd::fuzzing::config(data));
}
