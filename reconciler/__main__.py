from reconciler.entry import main

main()
