"""podbay.cli.commands"""
