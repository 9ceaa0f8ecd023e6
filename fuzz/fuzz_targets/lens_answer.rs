fn main() {
    afl::fuzz!(|data: &[u8]| routerd::fuzzing::lens_answer(data));
}
