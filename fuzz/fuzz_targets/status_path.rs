fn main() {
    afl::fuzz!(|data: &[u8]| routerd::fuzzing::status_path(data));
}
