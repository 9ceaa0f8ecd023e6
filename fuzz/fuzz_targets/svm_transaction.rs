fn main() {
    afl::fuzz!(|data: &[u8]| routerd::fuzzing::svm_transaction(data));
}
