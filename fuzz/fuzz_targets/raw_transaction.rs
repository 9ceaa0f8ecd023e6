fn main() {
    afl::fuzz!(|data: &[u8]| routerd::fuzzing::raw_transaction(data));
}
