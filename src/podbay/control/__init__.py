"""podbay.control"""
