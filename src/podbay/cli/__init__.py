"""podbay.cli"""
