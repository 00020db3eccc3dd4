from benchmarks.native_detail.cli import main

main()
