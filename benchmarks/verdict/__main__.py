from benchmarks.verdict.cli import main

main()
