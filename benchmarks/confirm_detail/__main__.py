from benchmarks.confirm_detail.cli import main

main()
