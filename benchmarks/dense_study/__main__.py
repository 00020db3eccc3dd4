from benchmarks.dense_study.cli import main

main()
