fn main() {
    afl::fuzz!(|data: &[u8]| routerd::fuzzing::revert_data(data));
}
