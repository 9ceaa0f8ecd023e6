fn main() {
    afl::fuzz!(|data: &[u8]| routerd::fuzzing::router_body(data));
}
