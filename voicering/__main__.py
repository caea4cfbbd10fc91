from voicering.cli import main

main()
