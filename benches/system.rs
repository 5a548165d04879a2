//! System benchmark (`make bench`): the code is `testkit::bench`, which the e2e tests'
//! short run (`tests/e2e_alone/bench_short.rs`) shares.

fn main() {
    testkit::bench::main();
}
