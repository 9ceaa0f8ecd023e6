fn main() {
    afl::fuzz!(|data: &[u8]| routerd::fuzzing::node_block(data));
}
